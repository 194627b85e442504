"""The daemon's wiring: config in, supervised watchers, detector, server; ordered stop.

Start: open the state DB and load clocks and firing alerts; start the HTTP
server; one watcher + one reconciler per identity (restartable), the
detector, the state flusher and the loop heartbeat (root tasks).
Stop (SIGTERM/SIGINT): stop intake (server), stop watchers, stop the
detector, flush state, close sessions — each step with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from watchd import __version__
from watchd.alerting import routing
from watchd.alerting.dispatch import Dispatcher
from watchd.alerting.model import Alert, AlertSink, fingerprint
from watchd.alerting.receivers.build import build_all
from watchd.alerting.silencing import (
    Inhibitor,
    Silence,
    Silencer,
    from_config,
    silence_from_json,
)
from watchd.coder.client import CoderClient
from watchd.coder.models import Chat
from watchd.coder.transport import USER_AGENT, Transport
from watchd.config.fields import ConfigError
from watchd.config.loading import load_config
from watchd.config.model import Config
from watchd.config.process import shard_index
from watchd.config.secrets import ResolvedSecrets, resolve_secrets
from watchd.config.watching import IdentityConfig
from watchd.daemon import reloading
from watchd.daemon.heartbeat import Heartbeat
from watchd.daemon.metrics import Metrics
from watchd.daemon.notify import SdNotifier
from watchd.daemon.preflight import StartupError, bind_problem, effective_state_dir
from watchd.daemon.server import Server
from watchd.daemon.statewatch import StateWatch
from watchd.daemon.status import HISTORY_EVERY, ChatHistory
from watchd.daemon.supervisor import Supervisor
from watchd.detection.detector import Detector
from watchd.detection.diagnosis import Facts
from watchd.detection.health import IdentityHealth
from watchd.kits import logs
from watchd.kits.clock import ServerClock
from watchd.kits.ratelimit import RateLimiter
from watchd.kits.tasks import TASKS
from watchd.remediation.sweeper import Sweeper
from watchd.store.chats import ChatRecord, ChatStore
from watchd.store.lock import StateInUse, StateLock
from watchd.store.persistence import StateDB
from watchd.telemetry.events import EventSink, EventSource, NullSink, own_source
from watchd.telemetry.filesource import FileSource
from watchd.telemetry.pipeline import SpanPipeline
from watchd.telemetry.spans import SpanConverter
from watchd.watching.quota import QuotaWatcher
from watchd.watching.watcher import IdentityWatcher, WatchSettings

log = logs.get("watchd.daemon")

# Task kinds that belong to one identity: their crash loops make the identity unhealthy.
IDENTITY_TASKS = frozenset({"watch", "reconcile", "quota", "confirm"})
STOP_DEADLINES = {"server": 1.0, "watchers": 2.0, "core": 1.0, "flush": 2.0, "spans": 2.0}
# How many identities may list at once: after a Coder restart, 50 watchers must not
# all list in the same second.
CONCURRENT_LISTINGS = 4


def build_telemetry(config: Config) -> SpanPipeline:
    t = config.telemetry
    kind = t.exporter_kind(dict(os.environ))
    export = None
    if kind != "none":
        # The OpenTelemetry SDK (and OTLP/gRPC with protobuf) only when spans are exported:
        # a sidecar that exports nothing never pays for importing it.
        from watchd.telemetry.export import (
            SpanExport,
            build_exporter,
            effective_otlp,
            printable_endpoint,
        )

        exporter = build_exporter(
            kind=kind, protocol=t.protocol, endpoint=t.endpoint, timeout=t.timeout
        )
        assert exporter is not None
        export = SpanExport(
            exporter,
            max_queue_size=t.max_queue_size,
            schedule_delay=t.schedule_delay,
            batch_size=t.batch_size,
        )
    if kind == "otlp":
        protocol, endpoint = effective_otlp(protocol=t.protocol, endpoint=t.endpoint)
        log.info(
            "telemetry.configured",
            exporter=kind,
            protocol=protocol,
            endpoint=printable_endpoint(endpoint),
            service_name=own_source("").service,
        )
    else:
        log.info("telemetry.configured", exporter=kind)
    return SpanPipeline(
        converter=SpanConverter(horizon_ms=int(t.pair_horizon * 1000), max_open=t.max_open_pairs),
        export=export,
        queue_size=t.ingest_queue,
    )


class TimedConfirmer:
    """The watcher as the detector's Confirmer, timing each confirmation read."""

    def __init__(self, watcher: IdentityWatcher, observe: Callable[[float], None]) -> None:
        self.watcher = watcher
        self.observe = observe

    async def get_chat(self, chat_id: str) -> Chat:
        t0 = time.monotonic()
        try:
            return await self.watcher.get_chat(chat_id)
        finally:
            self.observe(time.monotonic() - t0)

    async def relist(self) -> None:
        await self.watcher.relist()

    async def facts(self, record: ChatRecord, *, lookup: bool = True) -> Facts:
        return await self.watcher.facts(record, lookup=lookup)


class _Pending:
    """The detector's sink until the dispatcher exists (nothing fires before run())."""

    def put(self, alert: Alert) -> None:
        raise RuntimeError("alert fired before the daemon started its dispatcher")


def state_dir(config: Config) -> Path:
    return effective_state_dir(config.state_dir)


class Daemon:
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
        self.reloads = {"applied": 0, "rejected": 0}
        self.config = config
        self.secrets = secrets
        # Which identities this replica watches (sharding; all of them by default). A
        # replica number that cannot be read is a config problem `run` reports first.
        try:
            self.shard_index = shard_index(config)
        except ConfigError as exc:
            raise StartupError("; ".join(exc.problems)) from None
        self.version = __version__
        self.started = time.monotonic()
        self.last_beat = time.monotonic()
        self.supervisor = Supervisor()
        self.store = ChatStore()
        self.telemetry = build_telemetry(config)
        if events is not None:
            self.events: EventSink = events
        else:
            self.events = self.telemetry.sink if config.telemetry.own_events else NullSink()
        self._settings_from_config = settings is None
        self.settings = settings or WatchSettings(reconcile_interval=config.reconcile_interval)
        self.last_reload: dict[str, Any] | None = None
        try:
            self.state_lock = StateLock.acquire(state_dir(config))
        except StateInUse as exc:
            raise StartupError(f"state_dir: {exc}") from None
        except OSError as exc:
            raise StartupError(f"state_dir: cannot lock {state_dir(config)} ({exc})") from None
        try:
            self.db = StateDB.open(state_dir(config) / "watchd.sqlite3")
        except (OSError, sqlite3.Error) as exc:
            self.state_lock.release()
            raise StartupError(
                f"state_dir: cannot open {state_dir(config) / 'watchd.sqlite3'} ({exc})"
            ) from None
        loaded = self.store.load(self.db.load_chats())
        self.detector = Detector(
            store=self.store,
            sink=_Pending(),
            db=self.db,
            confirm_rate=config.detection.confirm_rate,
            listing_threshold=config.detection.confirm_listing_threshold,
            chat_failed=config.detection.chat_failed,
            link_template=config.chat_link_template,
        )
        self.state_watch = StateWatch(
            db=self.db, detector=self.detector, state_dir=str(state_dir(config))
        )
        self._sink_override = sink
        self.stdout = stdout
        self.route = routing.build(config.route)
        now = time.time()
        self.silencer = Silencer(
            [
                *from_config(config.silences, now=now),
                *(silence_from_json(b) for b in self.db.silences_load()),
            ]
        )
        self.inhibitor = Inhibitor(config.inhibit_rules)
        self.dispatcher: Dispatcher | None = None
        self.deadman: Heartbeat | None = None
        self.health: dict[str, IdentityHealth] = {}
        self.watchers: dict[str, IdentityWatcher] = {}
        self.file_sources: list[FileSource] = []
        self.sweeper: Sweeper | None = self._make_sweeper(config)
        self.metrics = Metrics(self)
        self.history = ChatHistory()
        self.server = Server(self, listen=config.server.listen)
        self._session: aiohttp.ClientSession | None = None
        self._gate = asyncio.Semaphore(CONCURRENT_LISTINGS)
        log.info(
            "state.loaded",
            chats=loaded,
            alerts_firing=len(self.detector.firing),
            path=str(self.db.path),
        )

    def add_silence(self, silence: Silence) -> None:
        self.silencer.add(silence)
        self.db.silence_save(silence.id, silence.to_json(time.time()))
        log.info(
            "silence.added",
            id=silence.id,
            matchers=[str(m) for m in silence.matchers],
            ends_at=silence.ends_at,
            created_by=silence.created_by,
        )

    def expire_silence(self, silence_id: str) -> Silence | None:
        existing = self.silencer.silences.get(silence_id)
        if existing is None or existing.source == "config":
            return None
        ended = self.silencer.expire(silence_id, now=time.time())
        if ended is not None:
            self.db.silence_save(ended.id, ended.to_json(time.time()))
            log.info("silence.expired", id=silence_id)
        return ended

    def ready(self) -> bool:
        return all(h.seeded_once for h in self.health.values())

    async def run(self, stop: asyncio.Event) -> int:
        # No pool limit: every identity holds one watch socket for good, so a per-host cap
        # below the identity count would starve REST calls forever. Request concurrency is
        # bounded per identity by its rate limiter instead.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
        )
        sup = self.supervisor
        try:
            if self._sink_override is not None:
                self.detector.sink = self._sink_override
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
                )
                self.dispatcher.on_delivered = self._delivered
                self.metrics.receivers(list(self.dispatcher.notifiers))
                restored = self.dispatcher.restore()
                self.detector.sink = self.dispatcher
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
            sup.spawn("status-history", self._sample_history, group="core", root=True)
            sup.spawn("detector", self.detector.run, group="core", root=True)
            self.state_watch.start()
            sup.spawn("state-flusher", self.state_watch.run, group="core", root=True)
            sup.spawn("systemd-notify", self._systemd, group="core", root=True)
            sup.spawn("spans", self.telemetry.run, group="core", root=True)
            if self.sweeper is not None:
                sup.spawn("sweep", self.sweeper.run, group="watchers", restart=True)
            for i, fs in enumerate(self.config.telemetry.sources):
                source = FileSource(
                    fs.path,
                    source=EventSource(fs.service, fs.instance, fs.agent),
                    sink=self.telemetry.sink,
                    from_start=fs.from_start,
                )
                self.file_sources.append(source)
                sup.spawn(f"file-source:{i}", source.run, group="watchers", restart=True)
            owned = self.owned()
            log.info(
                "sharding.owned",
                replica=self.shard_index,
                replicas=self.config.sharding.replicas,
                replication_factor=self.config.sharding.replication_factor,
                identities=[i.name for i in owned],
                others=len(self.config.identities) - len(owned),
            )
            for ident in owned:
                self.add_identity(ident)
            stopper = asyncio.create_task(stop.wait())
            ended = asyncio.create_task(sup.root_ended.wait())
            await asyncio.wait({stopper, ended}, return_when=asyncio.FIRST_COMPLETED)
            for t in (stopper, ended):
                t.cancel()
            code = 0
            if sup.root_ended.is_set():
                log.error("daemon.root_task_ended", task=sup.ended_by)
                code = 1
            return code
        finally:
            await self.shutdown()

    def owned(self, config: Config | None = None) -> list[IdentityConfig]:
        """The identities this replica watches under ``config`` (the current one)."""
        return (config or self.config).owned_identities(self.shard_index)

    def user_agent(self) -> str:
        """The Coder-facing User-Agent; with replicas it names this one, so Coder's logs
        (and the simulator's request log) say which replica asked."""
        sh = self.config.sharding
        if sh.replicas == 1:
            return USER_AGENT
        return f"{USER_AGENT} replica/{self.shard_index}-of-{sh.replicas}"

    def settled(self) -> bool:
        """Every identity's first seed attempt has ended, seeded or not (READY=1, /readyz).

        One that could not be seeded does not hold start-up back: it is reported by
        IdentityUnhealthy and /status instead.
        """
        return all(h.attempted_once for h in self.health.values())

    def status_line(self) -> str:
        parts = []
        for name, h in self.health.items():
            parts.append(f"{name} {h.state}" + (f" ({h.last_list_chats})" if h.ready else ""))
        return f"{'; '.join(parts)}; {len(self.detector.firing)} alerts firing"

    def progressing(self) -> bool:
        """The loop turns, no root task died, and no process-wide task is crash-looping
        (an identity's own tasks make that identity unhealthy instead)."""
        return (
            time.monotonic() - self.last_beat < 5.0
            and not self.supervisor.dead_roots()
            and not [n for n in TASKS.crash_looping() if n.split(":", 1)[0] not in IDENTITY_TASKS]
        )

    def alive_and_seeing(self) -> str | None:
        """None when the dead man's switch may say "alive": the loop makes progress, no
        root task died, every identity is ready or its IdentityUnhealthy is firing, and
        state persists. Otherwise why not."""
        if not self.progressing():
            return "the event loop or a root task is not making progress"
        for name, h in self.health.items():
            if h.ready:
                continue
            if fingerprint(h.deployment, name, "IdentityUnhealthy") not in self.detector.firing:
                return f"identity {name} is {h.state} and not yet alerted"
        if not self.db.persisting:
            return "state is not persisting"
        return None

    async def _systemd(self) -> None:
        """READY=1 once settled, STATUS= on change, WATCHDOG=1 while the loop progresses."""
        n = self.notifier
        interval = n.watchdog_interval
        tick = min(0.5, interval / 2) if interval else 0.5
        announced = False
        last_status = ""
        last_ping = 0.0
        while True:
            status = self.status_line()
            if not announced and self.settled():
                n.ready(status)
                announced, last_status = True, status
            elif announced and status != last_status:
                n.status(status)
                last_status = status
            now = time.monotonic()
            if interval and now - last_ping >= interval and self.progressing():
                n.watchdog()
                last_ping = now
            await asyncio.sleep(tick)

    async def reload(self) -> bool:
        """SIGHUP: apply a new config; an invalid one keeps the old one running."""
        self.notifier.reloading()
        path = self.config_path
        try:
            if path is None:
                raise ConfigError(["no configuration file to reload from"])
            config = load_config(path)
            secrets = resolve_secrets(config)
            index = shard_index(config)
        except ConfigError as exc:
            self.reloads["rejected"] += 1
            log.error(
                "reload.rejected",
                problems=exc.problems,
                note="the previous configuration stays in force",
            )
            self.notifier.notify(READY="1", STATUS="reload rejected: " + exc.problems[0][:200])
            return False
        previous = self.config
        paths = reloading.changed(previous, config)
        restart = reloading.needs_restart(paths)
        if not self._settings_from_config and "reconcile_interval" in paths:
            restart.append("reconcile_interval")  # fixed by the embedding (the demo)
        # Settings every watcher, detector verdict or quota poll reads at start: applying
        # them means restarting each identity (clocks and firing alerts are kept).
        everyone = any(
            p == "reconcile_interval"
            or p.startswith(("detection", "quota"))
            or p == "chat_link_template"
            for p in paths
        )
        if self._settings_from_config:
            self.settings = dataclasses.replace(
                self.settings, reconcile_interval=config.reconcile_interval
            )
        d = config.detection
        self.detector.confirm_rate = d.confirm_rate
        self.detector.listing_threshold = d.confirm_listing_threshold
        self.detector.chat_failed = d.chat_failed
        self.detector.link_template = config.chat_link_template
        # Only owned identities run here: a resharding reload starts and stops watchers
        # like an edit of the identity list would.
        old = {i.name: i for i in self.owned()}
        self.shard_index = index
        new = {i.name: i for i in self.owned(config)}
        removed = sorted(old.keys() - new.keys())
        added = sorted(new.keys() - old.keys())
        changed = sorted(
            n
            for n in old.keys() & new.keys()
            if old[n] != new[n]
            or self.config.budgets_for(old[n]) != config.budgets_for(new[n])
            or self.secrets.tokens[n].get_secret_value() != secrets.tokens[n].get_secret_value()
        )
        self.config, self.secrets = config, secrets
        still_configured = {i.name for i in config.identities}
        for name in removed:
            # Owned by another replica now (resharding): it keeps the alerts firing under
            # the same fingerprints, so they are handed over, not resolved.
            handed = name in still_configured
            await self.remove_identity(name, forget=True, hand_over=handed)
            self.metrics.identity_removed(name)
        for name in changed:
            # Same deployment: keep the chats' clocks and firing alerts; only restart.
            await self.remove_identity(name, forget=old[name].url != new[name].url)
            self.add_identity(new[name])
        for name in added:
            self.add_identity(new[name])
        if everyone:
            for name in sorted(old.keys() & new.keys()):
                if name not in changed:
                    await self.remove_identity(name, forget=False)
                    self.add_identity(new[name])
        if previous.sweep != config.sweep:
            await self._restart_sweeper()
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
        applied = [p for p in paths if p not in restart]
        self.reloads["applied"] += 1
        self.last_reload = {
            "at": time.time(),
            "applied": applied,
            "needs_restart": restart,
            "identities": {"added": added, "removed": removed, "changed": changed},
        }
        log.info(
            "reload.applied",
            settings=applied,
            added=added,
            removed=removed,
            changed=changed,
            needs_restart=restart,
        )
        for setting in restart:
            log.warning(
                "reload.needs_restart",
                setting=setting,
                note="changed in the file but not applied: restart watchd to use it",
            )
        status = self.status_line()
        if restart:
            status += f"; restart needed for {', '.join(restart)}"
        self.notifier.notify(READY="1", STATUS=status)
        return True

    def _make_sweeper(self, config: Config) -> Sweeper | None:
        if not config.sweep.enabled:
            return None
        return Sweeper(
            config=config.sweep,
            store=self.store,
            health=self.health,
            clients=lambda n: self.watchers[n].client if n in self.watchers else None,
            db=self.db,
            ledger=self.detector,
            audit_path=state_dir(config) / "sweep-audit.jsonl",
            labels=lambda n: next((i.labels for i in self.config.identities if i.name == n), {}),
            on_invalid=self.detector.note_invalid,
        )

    async def _restart_sweeper(self) -> None:
        """Sweep settings changed: a new sweeper (its counts and audit trail carried over)."""
        await self.supervisor.stop("sweep")
        old = self.sweeper
        self.sweeper = self._make_sweeper(self.config)
        if self.sweeper is not None:
            if old is not None:
                self.sweeper.counts.update(old.counts)
                self.sweeper.recent.extend(old.recent)
            self.supervisor.spawn("sweep", self.sweeper.run, group="watchers", restart=True)

    async def remove_identity(self, name: str, *, forget: bool, hand_over: bool = False) -> None:
        await self.supervisor.stop(f"watch:{name}")
        await self.supervisor.stop(f"reconcile:{name}")
        await self.supervisor.stop(f"quota:{name}")
        await self.detector.unregister(
            name, reason="identity removed from config", resolve=forget and not hand_over
        )
        if hand_over:
            dropped = self.detector.hand_over(name)
            if self.dispatcher is not None:
                self.dispatcher.hand_over(dropped)
            log.info("sharding.handed_over", identity=name, alerts=len(dropped))
        self.health.pop(name, None)
        self.watchers.pop(name, None)
        if forget:
            self.store.drop_identity(name)
            self.db.forget_identity(name)

    def add_identity(self, ident: IdentityConfig) -> None:
        assert self._session is not None
        name = ident.name
        clock = ServerClock()
        self.metrics.identity_added(name)
        health = IdentityHealth(
            name=name,
            deployment=ident.url,
            server_clock=clock,
            unhealthy_after=ident.unhealthy_after,
            on_listing=self.metrics.listing.labels(name).observe,
        )
        transport = Transport(
            base_url=ident.url,
            token=self.secrets.tokens[name].get_secret_value(),
            session=self._session,
            identity=name,
            events=self.events,
            source=own_source(name),
            server_clock=clock,
            limiter=RateLimiter(
                rate=ident.requests_per_minute / 60.0, burst=max(5, ident.requests_per_minute // 10)
            ),
            user_agent=self.user_agent(),
        )
        client = CoderClient(transport, page_size=ident.page_size)
        watcher = IdentityWatcher(
            health=health,
            client=client,
            store=self.store,
            detector=self.detector,
            listing_gate=self._gate,
            settings=self.settings,
            token_provider=lambda: self._reread_token(ident),
            rng=random.Random(),
        )
        self.health[name] = health
        self.watchers[name] = watcher
        self.detector.register(
            health,
            confirmer=TimedConfirmer(watcher, self.metrics.confirmation.labels(name).observe),
            budgets=self.config.budgets_for(ident),
            labels=ident.labels,
        )
        self.supervisor.spawn(
            f"watch:{name}", watcher.watch_forever, group="watchers", restart=True
        )
        self.supervisor.spawn(
            f"reconcile:{name}", watcher.reconcile_forever, group="watchers", restart=True
        )
        if self.config.quota.enabled:
            quota = QuotaWatcher(
                health=health,
                client=client,
                detector=self.detector,
                config=self.config.quota,
                labels=dict(ident.labels),
            )
            self.supervisor.spawn(f"quota:{name}", quota.run, group="watchers", restart=True)

    def _delivered(self, receiver: str, seconds: float) -> None:
        self.metrics.notification.labels(receiver).observe(seconds)

    @staticmethod
    def _reread_token(ident: IdentityConfig) -> str:
        from watchd.config import secrets

        return secrets.resolve(
            file=ident.token_file,
            env=ident.token_env,
            credential=ident.token_credential,
            what=f"identity {ident.name}",
        )

    async def _heartbeat(self) -> None:
        while True:
            self.last_beat = time.monotonic()
            await asyncio.sleep(1.0)

    async def _sample_history(self) -> None:
        """Chats by status per identity for the status page's last-hour chart."""
        while True:
            self.history.sample(self, time.time())
            await asyncio.sleep(HISTORY_EVERY)

    async def shutdown(self) -> None:
        """Ordered, deadline-bound: intake, watchers, core, state, sessions."""
        t0 = time.monotonic()
        self.notifier.stopping()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.stop(), STOP_DEADLINES["server"])
        hung = await self.supervisor.stop_group("watchers", deadline=STOP_DEADLINES["watchers"])
        for name in list(self.watchers):
            self.health[name].set_state("stopped")
        hung += await self.supervisor.stop_group("core", deadline=STOP_DEADLINES["core"])
        for w in self.detector.watched.values():
            if w.task is not None:
                w.task.cancel()
        if self.dispatcher is not None:
            await self.dispatcher.close(deadline=STOP_DEADLINES["flush"])
        with contextlib.suppress(Exception):
            await self.telemetry.close(deadline=STOP_DEADLINES["spans"])
        with contextlib.suppress(sqlite3.Error, OSError):
            self.db.close()
        self.state_lock.release()
        if self._session is not None:
            await self._session.close()
        log.info("daemon.stopped", seconds=round(time.monotonic() - t0, 2), hung=hung)
