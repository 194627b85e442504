"""Named, seeded fleets for the simulator.

Each scenario returns the identities a daemon should watch (username and
token), so ``watchd demo`` and the tests can point a daemon at it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from watchd.sim import quota
from watchd.sim.records import QUOTA_JOB_ERROR, Step
from watchd.sim.state import SimState


@dataclass(frozen=True)
class Identity:
    name: str
    username: str
    token: str


Scenario = Callable[[SimState], list[Identity]]


def empty(state: SimState) -> list[Identity]:
    """Two users, no chats: the base tests add what they need."""
    return [_ident(state, "team-a", "alice"), _ident(state, "team-b", "bob")]


def demo(state: SimState) -> list[Identity]:
    """Three identities, each failure mode of the seed README, visible within a minute
    when budgets are short (``watchd demo`` uses running 20s, requires_action 15s,
    interrupting 10s, pending 20s).

    - team-a: a healthy fleet (turns start and finish), one chat wedged in `running`
      while queued for capacity, one slow turn that finishes after ~45 s (its alert
      resolves), a chat that finishes *silently* (no watch event: caught by reconcile),
      and a workspace quota rising 30 credits a minute from 40 of 100.
    - team-b: a client-tool pause stranded in `requires_action`, a workspace whose
      build failed on quota, and subagent children.
    - team-c: a revoked token (IdentityUnhealthy).
    """
    a = state.add_user("alice", budget=100, consumed=40)
    quota.configure(a, {"rise_per_minute": 30}, state.now())
    b = state.add_user("bob", budget=50, consumed=50)
    c = state.add_user("carol")
    for i in range(4):
        state.add_chat(
            a,
            title=f"Refactor module {i}",
            status="running",
            script=[Step("running", 6 + 4 * i), Step("waiting")],
            labels={"ticket": f"OPS-{100 + i}"},
            progress_every=2.0,
        )
    state.add_chat(
        a,
        title="Fix flaky auth tests",
        status="running",
        queued_for_capacity=True,
        labels={"ticket": "OPS-12"},
    )
    state.add_chat(
        a,
        title="Migrate billing to v2 <!channel> & <script>",
        status="running",
        script=[Step("running", 45), Step("waiting")],
    )
    state.add_chat(
        a,
        title="Summarize incident 4411",
        status="running",
        script=[Step("running", 12), Step("waiting", silent=True)],
    )
    state.add_chat(a, title="Old finished chat", status="waiting", age=3600)
    state.add_chat(b, title="Run the SQL migration tool", status="requires_action")
    # coderd's real shape: the job's error text, no error_code.
    ws = state.add_workspace(
        b, build_status="failed", job_status="failed", job_error=QUOTA_JOB_ERROR
    )
    state.add_chat(b, title="Provision preview env", status="running", workspace=ws)
    root = state.add_chat(
        b,
        title="Orchestrate release notes",
        status="running",
        script=[Step("running", 20), Step("waiting")],
    )
    state.add_chat(
        b,
        title="explore: changelog",
        status="running",
        parent=root,
        script=[Step("running", 8), Step("waiting")],
    )
    state.add_chat(c, title="Carol's chat", status="running")
    state.revoke("carol")
    return [
        Identity("team-a", "alice", a.token),
        Identity("team-b", "bob", b.token),
        Identity("team-c", "carol", c.token),
    ]


def fleet(state: SimState, *, users: int = 3, chats_per_user: int = 50) -> list[Identity]:
    """Many users with mixed chats; a few percent wedged forever."""
    out = []
    for u in range(users):
        user = state.add_user(f"user{u:03d}")
        for i in range(chats_per_user):
            roll = state.rng.random()
            if roll < 0.05:
                state.add_chat(user, title=f"wedged {i}", status="running")
            elif roll < 0.5:
                state.add_chat(user, title=f"idle {i}", status="waiting", age=600)
            else:
                state.add_chat(
                    user,
                    title=f"busy {i}",
                    status="running",
                    script=[Step("running", 2 + state.rng.random() * 20), Step("waiting")],
                )
        out.append(Identity(f"id-{u:03d}", user.username, user.token))
    return out


def bulk(
    state: SimState,
    *,
    users: int = 50,
    chats_per_user: int = 2000,
    status: str = "waiting",
    age: float = 60.0,
) -> list[Identity]:
    """Sized fleets for benchmarks: every chat in one status, nothing scripted."""
    out = []
    for u in range(users):
        user = state.add_user(f"bulk{u:03d}")
        for i in range(chats_per_user):
            state.add_chat(
                user,
                title=f"chat {i}",
                status=status,
                age=age,
                publish=False,
                labels={"fleet": "bench"},
            )
        out.append(Identity(f"id-{u:03d}", user.username, user.token))
    return out


def trees(state: SimState) -> list[Identity]:
    """The chat-tree experiment on (every other scenario runs without it), with families
    to sweep and trees to cost. AI Gateway spend is set on each family root.

    - alice has opened her tree (her root exists and adopted her chats): "tree: done"
      (depth 2, idle, with an idle subagent); "tree: busy parent" (depth 2, idle) whose
      named child "tree: busy child" (depth 3) runs for 20 s more; "tree: nested" (depth
      3, idle) under "tree: shelf" (depth 2, idle); "tree: costly" (depth 2, running,
      $42 spent) with a running subagent "tree: costly/worker".
    - bob never opened his: his chats are parentless (``kind: chat``, no depth):
      "bob: pricey" (running, $12 spent) and "bob: cheap" (running, $1 spent).
    """
    state.enable_chat_tree()
    a = state.add_user("alice")
    b = state.add_user("bob")
    state.tree_root(a)
    old = 3600.0
    done = state.add_chat(a, title="tree: done", status="waiting", age=old)
    state.add_chat(a, title="tree: done/explore", status="waiting", age=old, parent=done)
    busy = state.add_chat(a, title="tree: busy parent", status="waiting", age=old)
    state.add_chat(
        a,
        title="tree: busy child",
        status="running",
        parent=busy,
        kind="chat",
        script=[Step("running", 20), Step("waiting")],
    )
    shelf = state.add_chat(a, title="tree: shelf", status="waiting", age=old)
    state.add_chat(a, title="tree: nested", status="waiting", age=old, parent=shelf, kind="chat")
    costly = state.add_chat(a, title="tree: costly", status="running", age=600)
    costly.spend_micros, costly.spend_requests, costly.spend_unpriced = 42_000_000, 310, 2
    state.add_chat(a, title="tree: costly/worker", status="running", age=600, parent=costly)
    pricey = state.add_chat(b, title="bob: pricey", status="running", age=600)
    pricey.spend_micros, pricey.spend_requests = 12_000_000, 90
    cheap = state.add_chat(b, title="bob: cheap", status="running", age=600)
    cheap.spend_micros, cheap.spend_requests = 1_000_000, 8
    return [Identity("team-a", "alice", a.token), Identity("team-b", "bob", b.token)]


def _ident(state: SimState, name: str, username: str) -> Identity:
    user = state.add_user(username)
    return Identity(name, username, user.token)


SCENARIOS: dict[str, Scenario] = {
    "empty": empty,
    "demo": demo,
    "fleet": fleet,
    "bulk": bulk,
    "trees": trees,
}
