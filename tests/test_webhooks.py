"""Webhooks: a durable outbox filled with each transition, delivered signed, retried
with back-off, seen once per event by a real receiver on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from _helpers import drain

import mainspring as ms
from mainspring.server import (
    TargetPolicy,
    WebhookDispatcher,
    sign_standard_webhook,
    sign_webhook,
    verify_standard_webhook,
    verify_webhook,
)

SECRET = "s3cret-s3cret-s3cret"


class Receiver:
    """Verifies signatures, refuses the first ``refuse`` deliveries of each event
    with a 500, and keeps the events it accepted (deduplicated by id, as a receiver
    should; ``accepted`` counts what got through so duplicates would show)."""

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse
        self.tries: Counter[str] = Counter()
        self.accepted: Counter[str] = Counter()
        self.events: dict[str, dict[str, Any]] = {}
        self.bad_signatures = 0
        self.hosts: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = verify_webhook(
                    SECRET,
                    timestamp=self.headers["Mainspring-Timestamp"],
                    signature=self.headers["Mainspring-Signature"],
                    body=body,
                ) and verify_standard_webhook(
                    SECRET,
                    event_id=self.headers["webhook-id"],
                    timestamp=self.headers["webhook-timestamp"],
                    signature=self.headers["webhook-signature"],
                    body=body,
                )
                event_id = self.headers["Mainspring-Event-Id"]
                with receiver.lock:
                    receiver.hosts.append(self.headers["Host"])
                    if not ok:
                        receiver.bad_signatures += 1
                        status = 401
                    else:
                        receiver.tries[event_id] += 1
                        if receiver.tries[event_id] <= receiver.refuse:
                            status = 500
                        else:
                            receiver.accepted[event_id] += 1
                            receiver.events[event_id] = json.loads(body)
                            status = 204
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(refuse=2)
    yield r
    r.close()


async def _deliver_until(app: ms.App, receiver: Receiver, count: int, dispatchers: int) -> None:
    """Run several dispatchers at once (as several server processes would)."""
    fleet = [
        WebhookDispatcher(
            app.store,
            backoff_s=0.02,
            max_backoff_s=0.1,
            poll_interval_s=0.01,
            allow_networks=["127.0.0.1/32"],  # the receiver is local
        )
        for _ in range(dispatchers)
    ]
    tasks = [asyncio.create_task(d.run()) for d in fleet]
    for _ in range(1000):  # up to 20 s
        if len(receiver.accepted) >= count:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # let any duplicate delivery show up
    for d in fleet:
        d.stop()
    await asyncio.gather(*tasks)


async def test_each_event_arrives_once_despite_refusals(app: ms.App, receiver: Receiver) -> None:
    @app.workflow
    async def gated(ctx: ms.RunContext, fail: bool) -> str:
        decision = await ctx.approval("go")
        if fail:
            raise ValueError("it broke")
        return f"approved={decision.approved}"

    hook, secret = app.store.add_webhook(receiver.url, app.clock.now(), secret=SECRET)
    assert secret == SECRET and hook.events == ("*",)
    ok = app.submit(gated, False)
    bad = app.submit(gated, True)
    gone = app.submit(gated, False)
    await drain(app)
    app.answer(ok.run_id, "approval:go", decision="approve")
    app.answer(bad.run_id, "approval:go", decision="approve")
    app.cancel(gone.run_id, "not needed")
    await drain(app)
    await _deliver_until(app, receiver, count=6, dispatchers=3)

    assert receiver.bad_signatures == 0
    assert all(n == 1 for n in receiver.accepted.values()), receiver.accepted
    assert all(n == 3 for n in receiver.tries.values())  # refused twice, then taken
    seen = sorted((e["run"]["id"], e["type"]) for e in receiver.events.values())
    assert seen == sorted(
        [
            (ok.run_id, "run.waiting"),
            (ok.run_id, "run.succeeded"),
            (bad.run_id, "run.waiting"),
            (bad.run_id, "run.failed"),
            (gone.run_id, "run.waiting"),
            (gone.run_id, "run.cancelled"),
        ]
    )
    by_type = {(e["run"]["id"], e["type"]): e for e in receiver.events.values()}
    assert by_type[(ok.run_id, "run.succeeded")]["run"]["output"] == "approved=True"
    assert by_type[(ok.run_id, "run.waiting")]["run"]["wait_reason"] == "signal:approval:go"
    assert by_type[(bad.run_id, "run.failed")]["run"]["workflow"] == "gated"
    assert "not needed" in json.dumps(by_type[(gone.run_id, "run.cancelled")]["run"]["error"])
    rows = app.store.outbox()
    assert len(rows) == 6 and all(r["delivered_at"] and r["attempts"] == 3 for r in rows)


async def test_event_filter_and_giving_up(app: ms.App) -> None:
    @app.workflow
    async def quick(ctx: ms.RunContext) -> int:
        return 1

    # Nothing listens on this port: every attempt fails; after max_attempts it stops.
    app.store.add_webhook("http://127.0.0.1:9/nowhere", app.clock.now(), events=["run.succeeded"])
    with pytest.raises(ms.ConfigError, match="unknown webhook events"):
        app.store.add_webhook("http://127.0.0.1:9/x", 0, events=["run.exploded"])
    with pytest.raises(ms.ConfigError, match="must start with http"):
        app.store.add_webhook("ftp://example.com", 0)
    await app.run(quick)
    [row] = app.store.outbox()
    assert row["event"] == "run.succeeded"
    dispatcher = WebhookDispatcher(
        app.store, backoff_s=0.0, max_attempts=3, timeout_s=1, allow_networks=["127.0.0.0/8"]
    )
    for _ in range(5):
        await dispatcher.deliver_once()
    [row] = app.store.outbox()
    assert row["attempts"] == 3 and row["delivered_at"] is None and row["next_at"] is None
    assert "ConnectError" in row["last_error"]
    # Retention takes a pruned run's settled events with it.
    app.store.prune(0, app.clock.now() + 1)
    assert app.store.outbox() == []


def test_signatures_are_checked() -> None:
    body = b'{"id":"evt_1"}'
    now = 1_800_000_000
    signature = sign_webhook(SECRET, now, body)
    assert verify_webhook(SECRET, timestamp=str(now), signature=signature, body=body, now=now)
    assert not verify_webhook(
        "other-secret-xxxx", timestamp=str(now), signature=signature, body=body, now=now
    )
    assert not verify_webhook(
        SECRET, timestamp=str(now), signature=signature, body=body + b" ", now=now
    )
    # An old delivery replayed later is refused even with a valid signature.
    assert not verify_webhook(
        SECRET, timestamp=str(now), signature=signature, body=body, now=now + 301
    )
    assert not verify_webhook(
        SECRET, timestamp="yesterday", signature=signature, body=body, now=now
    )


def test_standard_webhooks_signature_matches_the_spec_vector() -> None:
    """The test vector of the Standard Webhooks libraries: their verifiers accept ours."""
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    signature = sign_standard_webhook(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert verify_standard_webhook(
        secret,
        event_id="msg_p5jXN8AQM9LWM0D4loKWxJek",
        timestamp="1614265330",
        signature=f"v1,bogus {signature}",
        body=body,
        now=1614265330,
    )
    assert not verify_standard_webhook(
        secret,
        event_id="msg_other",
        timestamp="1614265330",
        signature=signature,
        body=body,
        now=1614265330,
    )


def test_generated_secrets_have_the_standard_form(app: ms.App) -> None:
    _, secret = app.store.add_webhook("https://hooks.example.com/x", app.clock.now())
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/x",
        "http://localhost/x",
        "http://10.1.2.3/x",
        "http://192.168.0.1/x",
        "http://169.254.169.254/latest/meta-data",  # cloud metadata
        "http://[::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://0.0.0.0/x",
    ],
)
def test_internal_webhook_targets_are_refused_unless_allowed(url: str) -> None:
    with pytest.raises(ms.ConfigError, match="webhook URL refused"):
        TargetPolicy().check_url(url)
    TargetPolicy(["*"]).check_url(url)
    TargetPolicy().check_url("https://hooks.example.com/x")  # names: checked at delivery
    TargetPolicy(["127.0.0.0/8", "10.0.0.0/8", "192.168.0.0/16"]).check_url("http://10.1.2.3/x")


async def test_delivery_refuses_internal_targets_and_keeps_no_secrets(
    app: ms.App, caplog: pytest.LogCaptureFixture
) -> None:
    @app.workflow
    async def quick(ctx: ms.RunContext) -> int:
        return 1

    class Noisy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b"internal stack trace with PRIVATE-DETAIL"
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Noisy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://user:PASSWORD1@127.0.0.1:{port}/hook?token=QUERYTOKEN"
    app.store.add_webhook(url, app.clock.now(), events=["run.succeeded"])
    await app.run(quick)
    try:
        with caplog.at_level("WARNING", logger="mainspring.webhooks"):
            await WebhookDispatcher(app.store).deliver_once()  # the default policy
            [row] = app.store.outbox()
            assert row["next_at"] is None and row["attempts"] == 1  # given up at once
            assert "target refused: 127.0.0.1 is a loopback address" in row["last_error"]
            app.store.outbox()  # (the row stays for operators)
            # Allowed: the receiver's answer is kept as a status line only.
            with app.store._write() as cur:
                cur.execute("UPDATE ms_outbox SET next_at = 0")
            allowed = WebhookDispatcher(app.store, allow_networks=["127.0.0.1/32"])
            await allowed.deliver_once()
        [row] = app.store.outbox()
        assert row["last_error"] == "HTTP 500 Internal Server Error"
        logged = caplog.text
        assert f"http://127.0.0.1:{port}/hook" in logged
        for secret in ("PASSWORD1", "QUERYTOKEN", "PRIVATE-DETAIL"):
            assert secret not in logged and secret not in str(app.store.outbox())
    finally:
        server.shutdown()
        server.server_close()


# Not globally routable, each in the forms that slipped through before: the shared
# (carrier-grade NAT) space with a cloud's metadata address, IETF assignments, and the
# IPv6 forms that carry a refused IPv4 address.
NOT_GLOBAL = [
    "100.64.0.1",
    "100.100.100.200",  # Alibaba Cloud's metadata service
    "192.0.0.1",
    "192.0.0.9",  # "global" to ipaddress, an IETF assignment all the same
    "192.88.99.1",
    "198.18.0.1",
    "224.0.0.251",  # multicast: "global" to ipaddress
    "255.255.255.255",
    "2002:a9fe:a9fe::1",  # 6to4 around 169.254.169.254
    "2002:7f00:1::",  # 6to4 around 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 (well-known prefix) of 169.254.169.254
    "64:ff9b::a64:6464",  # NAT64 of 100.100.100.200
    "64:ff9b:1::a9fe:a9fe",  # local-use NAT64
    "::ffff:169.254.169.254",  # IPv4-mapped
    "::ffff:100.100.100.200",
    "::169.254.169.254",  # IPv4-compatible
    "::ffff:0:169.254.169.254",  # IPv4-translated (SIIT)
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "2001:0:a9fe:a9fe::",  # Teredo with the metadata address as its server
    "fec0::1",  # site-local: "global" to ipaddress
    "ff0e::1",  # global-scope multicast: "global" to ipaddress
    "3fff::1",  # documentation (RFC 9637)
    "5f00::1",
    "4000::1",  # outside 2000::/3: nothing is allocated there
]
GLOBAL = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2002:808:808::1", "64:ff9b::808:808"]


@pytest.mark.parametrize("address", NOT_GLOBAL)
def test_the_policy_refuses_what_is_not_globally_routable(address: str) -> None:
    import ipaddress

    parsed = ipaddress.ip_address(address)
    problem = TargetPolicy().refusal(parsed)
    assert problem is not None and problem.startswith(f"{parsed} "), problem
    assert "--webhook-allow" in problem
    assert TargetPolicy(["*"]).refusal(parsed) is None


def test_the_policy_lets_global_addresses_through_and_says_what_an_address_carries() -> None:
    import ipaddress

    for address in GLOBAL:
        assert TargetPolicy().refusal(ipaddress.ip_address(address)) is None, address
    problem = TargetPolicy().refusal(ipaddress.ip_address("2002:a9fe:a9fe::1"))
    assert problem is not None and problem.startswith(
        "2002:a9fe:a9fe::1 leads through 6to4 to 169.254.169.254, a link-local address"
    )
    assert "--webhook-allow 169.254.169.254/32" in problem
    # An allowed network admits the IPv4 address in its IPv6 forms too.
    local = TargetPolicy(["127.0.0.0/8"])
    assert local.refusal(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert local.refusal(ipaddress.ip_address("::ffff:10.0.0.1")) is not None


def test_registration_refuses_what_is_not_globally_routable(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from mainspring.server import create_app

    hosts = [
        *(f"[{a}]" if ":" in a else a for a in NOT_GLOBAL),
        "127.1",  # every numeric form the resolver reads as an address
        "2130706433",
        "0x7f.0.0.1",
        "0251.0376.0251.0376",  # 169.254.169.254 in octal
        "LOCALHOST.",
    ]
    app = ms.App(f"sqlite:///{tmp_path / 'hooks.db'}")
    admin = {"Authorization": f"Bearer {app.admin.create_key('ops', ['admin'])[1]}"}
    with TestClient(create_app(app, webhooks=False)) as client:
        for host in hosts:
            r = client.post("/webhooks", json={"url": f"http://{host}/hook"}, headers=admin)
            assert r.status_code == 422, (host, r.text)
            assert r.json()["error"]["message"].startswith("webhook URL refused: "), host
        assert app.admin.list_webhooks() == []
        ok = client.post("/webhooks", json={"url": "https://[2606:4700::1111]/h"}, headers=admin)
        assert ok.status_code == 201, ok.text
    app.close()


def test_a_malformed_webhook_url_is_a_clear_422_not_a_server_error(tmp_path: Path) -> None:
    """URLs that Python's parser refuses (found by the API fuzzer as 500s): each is a 422
    that quotes the URL, over HTTP and from the App, and nothing is registered."""
    from fastapi.testclient import TestClient

    from mainspring.server import create_app

    app = ms.App(f"sqlite:///{tmp_path / 'hooks.db'}")
    admin = {"Authorization": f"Bearer {app.admin.create_key('ops', ['admin'])[1]}"}
    bad = ["http://[::1", "http://[zz]/x", "http://a]b/", "https://h:99999/", "http:///path"]
    with TestClient(create_app(app, webhooks=False), raise_server_exceptions=False) as client:
        for url in bad:
            r = client.post("/webhooks", json={"url": url}, headers=admin)
            assert r.status_code == 422, (url, r.text)
            assert repr(url) in r.json()["error"]["message"], r.text
            with pytest.raises(ms.ConfigError, match="webhook URL"):
                app.admin.add_webhook(url)
    assert app.admin.list_webhooks() == []
    app.close()


class _Resolver:
    """``socket.getaddrinfo`` (the OS boundary) answering for made-up names: each
    name's answers in turn, the last one from then on; other hosts as the OS does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> None:
        import socket

        self.answers = answers
        self.asked: Counter[str] = Counter()
        real = socket.getaddrinfo

        def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            name = host.decode() if isinstance(host, bytes) else host
            numeric = kwargs.get("flags", args[3] if len(args) > 3 else 0)
            if name not in self.answers or numeric & socket.AI_NUMERICHOST:
                return real(host, port, *args, **kwargs)
            self.asked[name] += 1
            given = self.answers[name]
            address = given[min(self.asked[name], len(given)) - 1]
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            where = (address, int(port or 0), 0, 0) if ":" in address else (address, port or 0)
            return [(family, socket.SOCK_STREAM, 6, "", where)]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


async def test_delivery_checks_what_the_name_resolves_to_then(
    app: ms.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that passed registration resolves, at delivery, to metadata addresses:
    given up, and no request is made (the client's transport never sees one)."""

    @app.workflow
    async def quick(ctx: ms.RunContext) -> int:
        return 1

    answers = {"meta.test": ["100.100.100.200"], "tunnel.test": ["2002:a9fe:a9fe::1"]}
    resolver = _Resolver(monkeypatch, answers)
    for name in answers:
        TargetPolicy().check_url(f"http://{name}/hook")  # a name passes registration
        app.store.add_webhook(f"http://{name}/hook", app.clock.now())
    await app.run(quick)
    sent: list[httpx.Request] = []

    def transport(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(204)

    async with httpx.AsyncClient(transport=httpx.MockTransport(transport)) as client:
        assert await WebhookDispatcher(app.store).deliver_once(client) == 2
    assert sent == []
    rows = app.store.outbox()
    assert len(rows) == 2 and all(r["next_at"] is None for r in rows)  # given up
    errors = sorted(r["last_error"] for r in rows)
    assert errors[0].startswith("target refused: 100.100.100.200 is a shared")
    assert errors[1].startswith("target refused: 2002:a9fe:a9fe::1 leads through 6to4")
    assert set(resolver.asked) == set(answers)


async def test_delivery_connects_to_the_address_it_checked(
    app: ms.App, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name answers an allowed address to the check and another
    one afterwards. The POST goes to the checked address (with the name in Host), so
    the second answer is never used."""

    @app.workflow
    async def quick(ctx: ms.RunContext) -> int:
        return 1

    receiver.refuse = 0
    port = receiver.server.server_address[1]
    # Both loopback (tests reach nothing else): only the first is allowed and listened on.
    resolver = _Resolver(monkeypatch, {"rebind.test": ["127.0.0.1", "127.0.0.2"]})
    app.store.add_webhook(f"http://rebind.test:{port}/hooks", app.clock.now(), secret=SECRET)
    await app.run(quick)
    await WebhookDispatcher(app.store, allow_networks=["127.0.0.1/32"]).deliver_once()
    [row] = app.store.outbox()
    assert row["delivered_at"] is not None, row["last_error"]
    assert sum(receiver.accepted.values()) == 1 and resolver.asked["rebind.test"] == 1
    assert receiver.hosts == [f"rebind.test:{port}"]
