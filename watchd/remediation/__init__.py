"""Remediation, the opt-in sweep: interrupt and archive chats that policies say are done for.

Off by default, and dry-run by default when on. Each pass matches every ready
identity's chats against the policies (first match wins) on the server's
clock. ``requires_action`` chats are never touched. Interrupt is
asynchronous: a chat is archived only once it settled (``waiting``/``error``),
within ``settle_timeout``; a subagent's archive goes to its root, any other
chat's (a chat-tree named chat too) to the chat itself, never to a tree root;
the family is looked at first, and a busy member is named (``blocked``) instead
of being found out by refused PATCHes (families). 409s are answers, not
failures to retry in a loop: "nothing to interrupt" ends the interrupt, "still
active" from a member watchd cannot see waits for a later pass (three tries), and "Chat is
in an invalid state." is its own answer: the chat is never recorded as
interrupted or archived, stuck alerts say so, and only with
``reconcile_invalid`` opted in is ``POST …/reconcile-invalid`` called (once,
rate-bounded, dry-run respected) before the chat is handled normally; its
409 "not in an invalid state" means the chat healed, and its 404 is about the
chat alone (recovering).
``orchestrator`` chats (one long-lived chat per user) are left alone unless
a policy names them with a ``mode`` matcher. Every decision and action goes
to the audit log (JSON lines), to ``/status``, and through the alert
pipeline as ChatSwept; progress lives in SQLite so a restart mid-sweep never
acts twice. A dry run's plan is not an action: it never blocks a real run.
"""

# policies (which policy applies, pure), sweeper (the passes and the actions on one
# chat), families (where an archive goes, what in the family holds it up), archiving
# (the archive step and coderd's answers to it), recovering (reconcile-invalid's
# answers), audit (the JSON-lines trail), announcing (ChatSwept through the ledger).
