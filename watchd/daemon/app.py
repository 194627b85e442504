"""The daemon's wiring: config in, supervised watchers, detector, server; ordered stop.

Start: open the state DB and load clocks and firing alerts; start the HTTP
server; one watcher + one reconciler per identity (restartable), the
detector, the state flusher and the loop heartbeat (root tasks).
Stop (SIGTERM/SIGINT): stop intake (server), stop watchers, stop the
detector, flush state, close sessions — each step with a deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from pathlib import Path
from typing import TextIO

import aiohttp

from watchd import __version__
from watchd.alerting import routing
from watchd.alerting.dispatch import Dispatcher
from watchd.alerting.model import Alert, AlertSink
from watchd.alerting.receivers.build import build_all
from watchd.alerting.silencing import Inhibitor, from_config
from watchd.coder import connections
from watchd.config.fields import ConfigError
from watchd.config.model import Config, shard_index
from watchd.config.secrets import ResolvedSecrets
from watchd.config.watching import IdentityConfig
from watchd.daemon import reloading, snapshot, view
from watchd.daemon.heartbeat import Heartbeat
from watchd.daemon.identities import Identities, announce_owned, plan, user_agent
from watchd.daemon.ingesting import IngestPort
from watchd.daemon.metrics import Metrics
from watchd.daemon.preflight import StartupError, bind_problem, effective_state_dir, open_state
from watchd.daemon.sdnotify import SdNotifier, keep_informed
from watchd.daemon.server import Server
from watchd.daemon.silences_api import AdminToken, SilenceBook, SilencesApi
from watchd.daemon.snapshot import Snapshot
from watchd.daemon.spans import build_pipeline, file_sources
from watchd.daemon.statewatch import StateWatch
from watchd.daemon.stopping import stop_in_order
from watchd.daemon.supervisor import Supervisor
from watchd.daemon.sweeping import SweepSlot
from watchd.daemon.view import ChatHistory
from watchd.detection.detector import Detector
from watchd.kits import logs
from watchd.kits.clock import LoopClock
from watchd.store.chats import ChatStore
from watchd.store.health import IdentityHealth
from watchd.store.rows import ChatRows
from watchd.store.timelines import Timelines
from watchd.telemetry.events import EventSink, NullSink
from watchd.watching.settings import WatchSettings
from watchd.watching.watcher import IdentityWatcher

log = logs.get("watchd.daemon")


class _Pending:
    """The detector's sink until the dispatcher exists (nothing fires before run())."""

    def put(self, alert: Alert) -> None:
        raise RuntimeError("alert fired before the daemon started its dispatcher")


class Daemon:
    """Wiring only, built in one place: each subsystem is made here (the dispatcher and
    the dead man's switch by run(), which owns their HTTP session), and the HTTP face
    reads them through ``snapshot()`` and the view."""

    def __init__(
        self,
        config: Config,
        secrets: ResolvedSecrets,
        *,
        sink: AlertSink | None = None,
        events: EventSink | None = None,
        settings: WatchSettings | None = None,
        stdout: TextIO | None = None,
        config_path: str | None = None,
        notifier: SdNotifier | None = None,
    ) -> None:
        self.config_path = config_path
        self.notifier = notifier or SdNotifier()
        self.config, self.secrets = config, secrets
        # Which identities this replica watches (sharding; all of them by default). A
        # replica number that cannot be read is a config problem `run` reports first.
        try:
            self.shard_index = shard_index(config)
        except ConfigError as exc:
            raise StartupError("; ".join(exc.problems)) from None
        self.version = __version__
        self.started = self.last_beat = time.monotonic()
        self.supervisor = Supervisor()
        # The one clock of this process's own time: the host's at start, then advanced by
        # the monotonic clock. Deadlines, server-clock estimates and repeat intervals all
        # read it, so a step of the host clock (NTP, a VM restore) moves none of them.
        self.clock = LoopClock()
        self.reloads = reloading.Reloads(self.clock.now)
        self.store = ChatStore()
        self.telemetry = build_pipeline(config.telemetry)
        if events is None:
            events = self.telemetry.sink if config.telemetry.own_events else NullSink()
        self.events = events
        self.file_sources = file_sources(config.telemetry, self.telemetry.sink)
        self._settings_from_config = settings is None
        self.settings = settings or WatchSettings(reconcile_interval=config.reconcile_interval)
        state_dir = effective_state_dir(config.state_dir)
        self.state_lock, self.db = open_state(state_dir)
        loaded = self.store.load(self.db.part(ChatRows).load())
        # Alerting: the dispatcher (or the test's sink) and the dead man's switch are
        # started by run(), which owns the HTTP session they send through.
        self._sink_override, self.stdout = sink, stdout
        self.route = routing.build(config.route)
        self.silences = SilenceBook.open(config.silences, self.db)
        self.silencer = self.silences.silencer
        self.inhibitor = Inhibitor(config.inhibit_rules)
        self.dispatcher: Dispatcher | None = None
        self.deadman: Heartbeat | None = None
        self._session: aiohttp.ClientSession | None = None
        self._wire_core(config, state_dir)
        self.telemetry.on_forwarded = self.detector.timelines.transport
        self.history = ChatHistory()
        self.ingest = IngestPort(sink=self.telemetry.sink, token=lambda: self.secrets.ingest_token)
        admin = AdminToken(lambda: self.secrets.admin_token)
        self.server = Server(
            self,
            ingest=self.ingest,
            listen=config.server.listen,
            max_body_bytes=config.server.max_body_bytes,
            identities=len(config.identities),
            silences=SilencesApi(self.silences, admin),
            render_metrics=self.metrics.render,
            admin=admin,
            reload=self.reload,
        )
        self.metrics.registry.register(self.server.inbound)
        log.info(
            "state.loaded",
            chats=loaded,
            alerts_firing=len(self.detector.firing),
            path=str(self.db.path),
        )

    def _wire_core(self, config: Config, state_dir: Path) -> None:
        """The detector, the state watch, the metrics registry, the identities (watchers,
        health) and the sweep slot."""
        self.detector = Detector(
            store=self.store,
            sink=_Pending(),
            db=self.db,
            confirm_rate=config.detection.confirm_rate,
            listing_threshold=config.detection.confirm_listing_threshold,
            chat_failed=config.detection.chat_failed,
            link_template=config.chat_link_template,
            external_url=config.server.external_url,
            wall=self.clock,
            incidents=config.incidents,
            timelines=Timelines(max_chats=self.store.capacity, identity_of=self.store.identity_of),
        )
        self.state_watch = StateWatch(db=self.db, detector=self.detector, state_dir=str(state_dir))
        self.metrics = Metrics(self)
        # The time-in-status histogram, called per transition: bound directly, once the
        # registry (which reads the detector) exists.
        self.detector.on_left = self.metrics.left_status
        self.identities = Identities(
            supervisor=self.supervisor,
            store=self.store,
            db=self.db,
            detector=self.detector,
            metrics=self.metrics,
            events=self.events,
            clock=self.clock,
        )
        self.health: dict[str, IdentityHealth] = self.identities.health  # the view reads them
        self.watchers: dict[str, IdentityWatcher] = self.identities.watchers
        self.sweep = SweepSlot(
            supervisor=self.supervisor,
            store=self.store,
            health=self.health,
            watchers=self.watchers,
            db=self.db,
            detector=self.detector,
            audit_path=state_dir / "sweep-audit.jsonl",
            labels=lambda n: next((i.labels for i in self.config.identities if i.name == n), {}),
            config=config.sweep,
        )

    def ready(self) -> bool:
        return all(h.seeded_once for h in self.health.values())

    async def run(self, stop: asyncio.Event) -> int:
        # Idle connections outlive the gap between two reconciles (coder.connections).
        self._session = connections.open_session(
            keepalive=connections.keepalive_for(self.settings.reconcile_interval)
        )
        self.identities.session = self._session
        sup = self.supervisor
        try:
            if self._sink_override is not None:
                self.detector.ledger.sink = self._sink_override
            else:
                self.dispatcher = Dispatcher(
                    route=self.route,
                    notifiers=build_all(
                        self.config, self.secrets, self._session, stdout=self.stdout
                    ),
                    db=self.db,
                    silencer=self.silencer,
                    inhibitor=self.inhibitor,
                    external_url=self.config.server.external_url,
                    wall=self.clock,
                )
                self.dispatcher.on_delivered = self.metrics.delivered
                self.identities.dispatcher = self.dispatcher
                self.metrics.receivers(list(self.dispatcher.notifiers))
                restored = self.dispatcher.restore()
                self.detector.ledger.sink = self.dispatcher
                sup.spawn("dispatch-housekeeping", self.dispatcher.run, group="core", root=True)
                log.info("dispatch.restored", alerts=restored)
            try:
                bound = await self.server.start()
            except OSError as exc:
                raise StartupError(bind_problem(self.config.server.listen, exc)) from None
            log.info("server.listening", listen=bound)
            sup.spawn("heartbeat", self._heartbeat, group="core", root=True)
            if self.config.heartbeat.enabled:
                url = self.secrets.heartbeat_url
                self.deadman = Heartbeat(
                    config=self.config.heartbeat,
                    url=url.get_secret_value() if url is not None else None,
                    notifiers=self.dispatcher.notifiers if self.dispatcher is not None else {},
                    session=self._session,
                    healthy=self.alive_and_seeing,
                )
                sup.spawn("deadman-switch", self.deadman.run, group="core", restart=True)
            keep = functools.partial(self.history.keep, self.store, self.health)
            sup.spawn("status-history", keep, group="core", root=True)
            sup.spawn("detector", self.detector.run, group="core", root=True)
            self.state_watch.start()
            sup.spawn("state-flusher", self.state_watch.run, group="core", root=True)
            sup.spawn("systemd-notify", self._systemd, group="core", root=True)
            sup.spawn("spans", self.telemetry.run, group="core", root=True)
            self.sweep.start()
            for i, source in enumerate(self.file_sources):
                sup.spawn(f"file-source:{i}", source.run, group="watchers", restart=True)
            owned = self.owned()
            announce_owned(self.config, self.shard_index, owned)
            for ident in owned:
                self.add_identity(ident)
            stopper = asyncio.create_task(stop.wait())
            ended = asyncio.create_task(sup.root_ended.wait())
            await asyncio.wait({stopper, ended}, return_when=asyncio.FIRST_COMPLETED)
            for t in (stopper, ended):
                t.cancel()
            if not sup.root_ended.is_set():
                return 0
            log.error("daemon.root_task_ended", task=sup.ended_by)
            return 1
        finally:
            await self.shutdown()

    def owned(self) -> list[IdentityConfig]:
        """The identities this replica watches under the current config."""
        return self.config.owned_identities(self.shard_index)

    def snapshot(self) -> Snapshot:
        """Every subsystem's numbers as plain data, for /status and /metrics."""
        return snapshot.take(
            store=self.store,
            health=self.health,
            watchers=self.watchers,
            db=self.db,
            deadman=self.deadman,
            sweep=self.sweep,
            dispatcher=self.dispatcher,
            telemetry=self.telemetry,
            ingest=self.ingest,
            file_sources=self.file_sources,
            reloads=self.reloads,
        )

    def settled(self) -> bool:
        """Every identity's first seed attempt has ended, seeded or not (READY=1, /readyz).

        One that could not be seeded does not hold start-up back: it is reported by
        IdentityUnhealthy and /status instead.
        """
        return all(h.attempted_once for h in self.health.values())

    def status_line(self) -> str:
        return view.status_line(self)

    def progressing(self) -> bool:
        """The loop turns, no root task died, and no process-wide task is crash-looping
        (an identity's own tasks make that identity unhealthy instead)."""
        return not view.liveness_problems(self)

    def alive_and_seeing(self) -> str | None:
        return view.not_seeing(self, persisting=self.db.persisting)

    async def _systemd(self) -> None:
        await keep_informed(
            self.notifier,
            status_line=self.status_line,
            settled=self.settled,
            progressing=self.progressing,
        )

    async def reload(self) -> reloading.Outcome:
        """SIGHUP and POST /-/reload: apply a new config; an invalid one keeps the old one
        running. The file is compared with what runs (reloading.propose)."""
        fixed = frozenset() if self._settings_from_config else frozenset({"reconcile_interval"})
        return await self.reloads.run(
            lambda: reloading.propose(self.config_path, self.config, fixed=fixed),
            self._apply,
            notifier=self.notifier,
            status_line=self.status_line,
        )

    async def _apply(self, proposal: reloading.Proposal) -> dict[str, list[str]]:
        """Carry a valid proposal out; ``self.config`` becomes what runs."""
        previous = self.config
        config, secrets, index = proposal.running, proposal.secrets, proposal.index
        if self._settings_from_config:
            self.settings = dataclasses.replace(
                self.settings, reconcile_interval=config.reconcile_interval
            )
        self.detector.retune(config)
        if self._session is not None:
            connections.retune(self._session, self.settings.reconcile_interval)
        # Only owned identities run here: a resharding reload starts and stops watchers
        # like an edit of the identity list would. One owned by another replica now keeps
        # its alerts firing there under the same fingerprints: handed over, not resolved.
        old_owned, new_owned = self.owned(), config.owned_identities(index)
        p = plan((self.config, self.secrets, old_owned), (config, secrets, new_owned))
        self.shard_index = index
        self.config, self.secrets = config, secrets
        await self.identities.apply(
            p,
            before={i.name: i for i in old_owned},
            after={i.name: i for i in new_owned},
            restart_all=proposal.restart_identities,
            start=self.add_identity,
        )
        if previous.sweep != config.sweep:
            await self.sweep.replace(config.sweep)
        self.route = routing.build(config.route)
        self.inhibitor = Inhibitor(config.inhibit_rules)
        self.silencer.replace_config(from_config(config.silences, now=time.time()))
        if self.dispatcher is not None and self._session is not None:
            self.dispatcher.reconfigure(
                route=self.route,
                inhibitor=self.inhibitor,
                notifiers=build_all(config, secrets, self._session, stdout=self.stdout),
            )
            self.dispatcher.external_url = config.server.external_url
            self.metrics.receivers(list(self.dispatcher.notifiers))
        return {"added": p.added, "removed": p.removed, "changed": p.changed}

    def add_identity(self, ident: IdentityConfig) -> None:
        self.identities.add(
            ident,
            token=self.secrets.tokens[ident.name].get_secret_value(),
            config=self.config,
            settings=self.settings,
            user_agent=user_agent(self.config.sharding.replicas, self.shard_index),
        )

    async def _heartbeat(self) -> None:
        while True:
            self.last_beat = time.monotonic()
            await asyncio.sleep(1.0)

    async def shutdown(self) -> None:
        """Ordered, deadline-bound: intake, watchers, core, state, sessions."""
        await stop_in_order(
            notifier=self.notifier,
            server=self.server,
            supervisor=self.supervisor,
            health={n: self.health[n] for n in self.watchers},
            detector=self.detector,
            dispatcher=self.dispatcher,
            telemetry=self.telemetry,
            db=self.db,
            lock=self.state_lock,
            session=self._session,
        )
