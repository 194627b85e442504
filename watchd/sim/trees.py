"""Families and the ``chat-tree`` experiment (in flight upstream), as coderd keeps them.

A mixin of :class:`~watchd.sim.state.SimState`. Without the experiment a family is a
root chat and the subagents beneath it (``root_chat_id``). With it (off by default,
on per scenario: :meth:`ChatTrees.enable_chat_tree`) every owner may have one *tree
root* (``kind: root``, never listed, never archivable) that adopts the owner's
parentless chats; named chats (``kind: chat``) nest under it and under each other up
to ``ChatTreeMaxDepth`` (the root is depth 1), and subagents (``kind: subagent``) hang
off a named chat. Archiving a named chat covers its whole subtree: named descendants
and subagents (``chatstate.SetFamilyArchived``, ``GetChatSubtreeIDs``); unarchiving
restores the chat and its direct subagents only, and not under an archived parent.

What the experiment puts on the wire is :mod:`watchd.sim.payloads`' (``kind``; ``depth``
and ``child_chat_count`` on a single GET of a chat attached to a tree).
"""

from __future__ import annotations

from collections.abc import Callable

from watchd.sim.records import ARCHIVABLE, SimChat, SimError, SimUser

# codersdk.ChatTreeMaxDepth: the root is depth 1; named chats go down to 5.
MAX_DEPTH = 5
ROOT_TITLE = "Root"  # chatd.ChatTreeRootTitle
ROOT_ONLY = "Chat archive state can only be changed on the root chat."
# patchChat: a family with a member paused at a queued message under edit (in flight).
PAUSED_ARCHIVE_REFUSAL = (
    "Cannot archive: a chat in this family is paused at a queued message under edit. "
    "Finish editing, send, or remove that message first."
)


class ChatTrees:
    """The experiment's switch, the per-owner roots, and family membership."""

    chats: dict[str, SimChat]
    chat_tree: bool
    tree_roots: dict[str, str]
    _children: dict[str, list[str]]
    _family: dict[str, list[str]]

    add_chat: Callable[..., SimChat]
    chats_of: Callable[[str], list[SimChat]]
    children_of: Callable[[str], list[SimChat]]

    def enable_chat_tree(self) -> None:
        """Turn the ``chat-tree`` experiment on (a deployment's ``CODER_EXPERIMENTS``)."""
        self.chat_tree = True

    def tree_root(self, owner: SimUser) -> SimChat:
        """``chatd.EnsureChatTreeRoot``: the owner's root, made on first use, adopting the
        owner's parentless chats (only ``parent_chat_id`` changes: ``updated_at`` does not
        move and nothing is published)."""
        rid = self.tree_roots.get(owner.id)
        if rid is not None and rid in self.chats:
            return self.chats[rid]
        root = self.add_chat(owner, title=ROOT_TITLE, status="waiting", kind="root", publish=False)
        self.tree_roots[owner.id] = root.id
        for chat in self.chats_of(owner.id):
            if chat.parent_id is None and chat.kind != "root":
                chat.parent_id = root.id
                chat.root_id = None  # a named chat's root_chat_id column stays NULL
                self._children.setdefault(root.id, []).append(chat.id)
        return root

    def placement(
        self, owner: SimUser, parent: SimChat | None, kind: str | None
    ) -> tuple[str, SimChat | None]:
        """(kind, parent) of a new chat, as ``chatd.CreateChat`` decides them; ValueError
        for what coderd refuses (the tree's parent rules, its depth limit)."""
        if kind == "root":
            return "root", None
        if not self.chat_tree:
            return ("subagent" if parent else "chat"), parent
        if parent is None:
            # New chats default to the owner's root once it exists.
            return "chat", self.chats.get(self.tree_roots.get(owner.id, ""))
        if parent.kind == "subagent":
            raise ValueError("Subagent chats cannot have child chats.")
        if parent.archived:
            raise ValueError("Cannot create a chat under an archived parent.")
        kind = kind or "subagent"
        if kind == "chat" and self.depth(parent) >= MAX_DEPTH:
            raise ValueError("Chat tree depth limit exceeded.")
        return kind, parent

    def depth(self, chat: SimChat) -> int:
        """``GetChatTreeDepthByID``: 1 for a root, one more per named ancestor; 0 when the
        chain does not end at a root (a chat outside any tree) or for a subagent."""
        n, node = 0, chat
        while node.kind != "subagent":
            n += 1
            if node.kind == "root":
                return n
            parent = self.chats.get(node.parent_id or "")
            if parent is None:
                break
            node = parent
        return 0

    def named_children(self, chat: SimChat) -> list[SimChat]:
        """``CountChatChildrenByParentID`` with kind chat (archived ones count too)."""
        return [c for c in self.children_of(chat.id) if c.kind == "chat"]

    def members(self, chat: SimChat) -> list[SimChat]:
        """What archiving ``chat`` covers, the chat first: its family (the root and every
        chat whose root it is), or under the experiment its whole subtree."""
        if not self.chat_tree:
            fam = self._family.get(chat.id, ())
            return [chat, *(self.chats[c] for c in fam if c in self.chats)]
        out, queue = [chat], [chat]
        while queue:
            for child in self.children_of(queue.pop(0).id):
                out.append(child)
                queue.append(child)
        return out

    def unarchive_members(self, chat: SimChat) -> list[SimChat]:
        """What unarchiving covers: the family, or under the experiment the chat and its
        direct subagents only (``GetChatAndSubagentIDs``), never its named children."""
        if not self.chat_tree:
            return self.members(chat)
        return [chat, *(c for c in self.children_of(chat.id) if c.kind == "subagent")]

    def check_archive(self, chat: SimChat, *, state_machine: bool) -> None:
        """``patchChat`` and ``chatstate.SetFamilyArchived``'s refusals of an archive, in
        their order. A member in an invalid execution state aborts the cascade even when it
        is archived already; then a paused member, then any active one (only ``waiting``
        and ``error`` may be archived: the cascade is atomic). Older eras (no state
        machine) refuse none of those: the caller stops active members first."""
        if self.is_subagent(chat):
            raise SimError(400, ROOT_ONLY)
        if chat.archived:
            raise SimError(400, "Chat is already archived.")
        if chat.kind == "root":
            raise SimError(400, "Chat tree root cannot be archived.")
        if not state_machine:
            return
        members = self.members(chat)
        if any(m.invalid_state for m in members):
            raise SimError(409, "Chat is in an invalid state.")
        live = [m for m in members if not m.archived]
        if any(m.status == "paused" for m in live):
            raise SimError(409, PAUSED_ARCHIVE_REFUSAL)
        for m in live:
            if m.status not in ARCHIVABLE:
                # The detail is chatstate's error string: it does not say which member.
                raise SimError(
                    409,
                    "Cannot archive an active chat. Interrupt or wait for the chat to finish "
                    "first.",
                    f"transition not allowed: SetArchived from {m.status}",
                )

    def check_unarchive(self, chat: SimChat) -> None:
        """``patchChat``'s refusals of an unarchive (``ErrChatParentArchived`` under the
        experiment: a chat under an archived parent stays archived)."""
        if self.is_subagent(chat):
            raise SimError(400, ROOT_ONLY)
        if not chat.archived:
            raise SimError(400, "Chat is not archived.")
        parent = self.chats.get(chat.parent_id) if chat.parent_id else None
        if parent is not None and parent.archived:
            raise SimError(400, "Cannot unarchive a chat whose parent chat is archived.")

    def listed_as_row(self, chat: SimChat) -> bool:
        """A listing row (newest eras), not a chat embedded in its parent's ``children``:
        a root chat, or under the experiment every named chat (the tree root is never
        listed; subagents ride in their parent's ``children``). Inferred: the tree's
        ``GetChats`` filter is not in the code read, only that the root is never listed."""
        return chat.kind == "chat" if self.chat_tree else chat.parent_id is None

    def is_subagent(self, chat: SimChat) -> bool:
        """A child that cannot be archived on its own: any chat with a parent, or under
        the experiment a ``subagent`` (a named chat's parent does not make it one)."""
        return chat.kind == "subagent" if self.chat_tree else chat.parent_id is not None
