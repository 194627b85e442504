"""Runs a soak: the real ``watchd sim`` and ``watchd run`` (the e2e harness), the soak's
receiver, and the schedule's actions at their times; returns the :class:`Run` record.

The driver only acts and records. What happened to the chats is the simulator's own
journal; who held a watch socket when is polled from the simulator four times a second;
kills, restarts, reloads and receiver outages are noted with the host time they ran.
A daemon that exits without being killed is a crash: noted (with its last log lines)
and started again, so the run goes on and the oracle judges the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.harness import DaemonProcess, SimProcess
from tests.soak.receiver import SoakReceiver
from tests.soak.record import Run
from tests.soak.schedule import Action, owner
from tests.soak.shape import Shape, Variant
from tests.soak.tolerances import Tolerances

POLL = 0.25  # seconds between looks at who holds a watch socket
DRAIN = 8.0  # after the last move, beyond the slowest resolve's tolerance


class Soak:
    def __init__(
        self,
        tmp: Path,
        *,
        seed: int,
        shape: Shape,
        variants: Sequence[Variant],
        tol: Tolerances,
        actions: Sequence[Action],
        budget_scale: float = 1.0,
        drop_every_other: bool = False,
    ) -> None:
        self.tmp = tmp
        self.seed = seed
        self.shape = shape
        self.variants = variants
        self.tol = tol
        self.actions = actions
        self.budget_scale = budget_scale
        self.receiver = SoakReceiver(
            drop_every_other=drop_every_other, retry_after=shape.receiver_retry_after
        )
        self.sim = SimProcess(scenario=f"bulk_{shape.identities}")
        self.users = [f"bulk{i:03d}" for i in range(shape.identities)]
        self.daemon: DaemonProcess | None = None
        self.session: aiohttp.ClientSession | None = None
        self.ids: dict[int, str] = {}  # slot → the chat now in it
        self.variant = 0
        self.up = asyncio.Event()  # the daemon answers /healthz since its last start
        self.killed = False
        self.run_: Run | None = None
        self.unwatched: dict[str, float] = {}  # username → wall since no socket was open
        self._tasks: set[asyncio.Task[None]] = set()

    # -- plumbing ---------------------------------------------------------------------

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        assert self.session is not None
        async with self.session.request(method, self.sim.url + "/__sim" + path, json=body) as r:
            data = await r.json()
            assert r.status == 200, (method, path, data)
            return data

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _config(self) -> dict[str, Any]:
        assert self.daemon is not None
        extra = self.variants[self.variant].config(
            self.receiver.url, budget_scale=self.budget_scale
        )
        return {**self.daemon.config, **extra}

    # -- the run ----------------------------------------------------------------------

    async def run(self) -> Run:
        self.sim.start()
        await self.receiver.start()
        self.session = aiohttp.ClientSession()
        run = self.run_ = Run(
            seed=self.seed,
            minutes=self.shape.minutes,
            identities={u: f"team-{i}" for i, u in enumerate(self.users)},
            variants=[v.as_dict() for v in self.variants],
            budget_scale=self.budget_scale,
            max_clock_step=self.shape.max_clock_step,
            receiver_retry_after=self.shape.receiver_retry_after,
            started=0.0,
            ended=0.0,
            observed_until=0.0,
            watch_gaps={u: [] for u in self.users},
        )
        try:
            self._spawn(self._poll_watching())
            for action in self.actions:
                if action.at < 0:
                    await self._do(action)
            first = self.variants[0]
            self.daemon = DaemonProcess(
                self.tmp,
                self.sim,
                identities=[(f"team-{i}", u) for i, u in enumerate(self.users)],
                extra=first.config(self.receiver.url, budget_scale=self.budget_scale),
                identity_extra={"unhealthy_after": f"{first.unhealthy_after:g}s"},
            )
            run.configs.append([time.time(), 0])
            self.daemon.start()
            await self.daemon.wait_ready(within=60)
            self.up.set()
            self._spawn(self._watch_daemon())
            run.started = time.time()
            for action in self.actions:
                if action.at >= 0:
                    delay = run.started + action.at - time.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await self._do(action)
                    run.actions[action.kind] = run.actions.get(action.kind, 0) + 1
            await asyncio.sleep(self.tol.resolve(heard=False, gone=True) + DRAIN)
            self.killed = True  # from here on an exit is ours
            rc = self.daemon.terminate(timeout=20)
            run.observed_until = time.time()
            for user, since in self.unwatched.items():
                run.watch_gaps[user].append([since, run.observed_until])
            if rc != 0:
                run.crashes.append(f"exit status {rc} after SIGTERM")
            history = await self.admin("GET", "/history")
            run.journal, run.journal_dropped = history["entries"], history["dropped"]
            run.final_chats = (await self.admin("GET", "/state"))["chats"]
            run.deliveries = [[t, body] for t, body in self.receiver.deliveries]
            run.refused, run.rejected = self.receiver.refused, list(self.receiver.rejected)
            return run
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.daemon is not None:
                self.daemon.stop()
            await self.session.close()
            await self.receiver.stop()
            self.sim.stop()

    async def _do(self, a: Action) -> None:
        """Run one action (chat moves through the admin API, faults, the daemon)."""
        run = self.run_
        assert run is not None
        chat = self.ids.get(a.slot)
        match a.kind:
            case "create":
                made = await self.admin(
                    "POST",
                    "/chats",
                    {
                        "owner": self.users[owner(a.slot, self.shape)],
                        "status": a.status,
                        "age": a.value,
                        "title": f"soak {a.slot}",
                        # Interrupts never settle by themselves: every move is the schedule's.
                        "wedged": True,
                    },
                )
                self.ids[a.slot] = made["id"]
            case "move":
                await self.admin(
                    "POST", f"/chats/{chat}/status", {"status": a.status, "silent": a.silent}
                )
            case "bump":
                await self.admin("POST", f"/chats/{chat}/bump", {})
            case "archive":
                await self.admin("POST", f"/chats/{chat}/archive")
            case "delete":
                await self.admin("DELETE", f"/chats/{chat}")
            case "coder_errors":
                await self.admin("POST", "/faults", {"error_rate": a.value, "error_status": a.code})
            case "coder_ok":
                await self.admin("POST", "/faults", {"error_rate": 0.0})
            case "throttle":
                await self.admin(
                    "POST", "/faults", {"throttle_next": a.code, "throttle_retry_after": a.value}
                )
            case "throttle_off":
                await self.admin("POST", "/faults", {"throttle_next": 0})
            case "sim_restart":
                await self.admin("POST", "/restart", {"downtime": a.value})
            case "drop_watch":
                await self.admin("POST", "/drop-watch", {"code": a.code})
            case "clock":
                await self.admin("POST", "/clock", {"offset": a.value})
            case "receiver_down":
                self.receiver.down = a.mode
                run.receiver_outages.append([time.time(), 0.0, a.mode])
            case "receiver_up":
                self.receiver.down = None
                run.receiver_outages[-1][1] = time.time()
            case "kill":
                self._kill()
            case "start":
                self._start()
            case "sighup":
                self._spawn(self._reload(a.code))
            case "end":
                run.ended = time.time()
            case _:
                raise AssertionError(f"unknown action {a.kind}")

    # -- the daemon ---------------------------------------------------------------------

    def _kill(self) -> None:
        assert self.daemon is not None and self.run_ is not None
        self.killed = True
        self.up.clear()
        self.daemon.kill9()
        self.run_.kills.append([time.time(), 0.0])

    def _start(self) -> None:
        assert self.daemon is not None and self.run_ is not None
        self.daemon.start()
        self.run_.kills[-1][1] = time.time()
        self.killed = False
        self._spawn(self._wait_up())

    async def _wait_up(self) -> None:
        assert self.daemon is not None
        with contextlib.suppress(AssertionError):
            await self.daemon.wait_up(within=60)
            self.up.set()

    async def _reload(self, variant: int) -> None:
        """SIGHUP with the variant's config once the daemon answers (a process still
        starting would die of the signal); the file is written just before it."""
        assert self.daemon is not None and self.run_ is not None
        while True:
            await self.up.wait()
            proc = self.daemon.proc
            if self.up.is_set() and proc is not None and proc.poll() is None:
                break
            await asyncio.sleep(0.1)  # exited meanwhile: the crash watch clears ``up``
        self.variant = variant
        self.daemon.rewrite(self._config())
        self.daemon.signal(signal.SIGHUP)
        self.run_.configs.append([time.time(), variant])

    async def _watch_daemon(self) -> None:
        """A daemon that exits on its own is a crash: noted, and started again."""
        assert self.daemon is not None and self.run_ is not None
        while True:
            await asyncio.sleep(0.5)
            proc = self.daemon.proc
            if self.killed or proc is None or proc.poll() is None:
                continue
            tail = "\n".join(self.daemon.logs().splitlines()[-20:])
            self.run_.crashes.append(f"exit status {proc.returncode} at {time.time():.3f}:\n{tail}")
            self.up.clear()
            self.daemon.start()
            self._spawn(self._wait_up())

    async def _poll_watching(self) -> None:
        """Note, per user, the times no watch socket was open (the simulator's view)."""
        assert self.run_ is not None
        gaps = self.run_.watch_gaps
        open_since = self.unwatched
        open_since.update({u: time.time() for u in self.users})
        while True:
            try:
                doc = await self.admin("GET", "/watching")
            except (aiohttp.ClientError, AssertionError):
                await asyncio.sleep(POLL)
                continue
            now = doc["wall"]
            for u in self.users:
                if u in doc["watching"]:
                    if u in open_since:
                        gaps[u].append([open_since.pop(u), now])
                elif u not in open_since:
                    open_since[u] = now
            await asyncio.sleep(POLL)
