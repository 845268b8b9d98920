"""The console's pages over HTTP (httpx against the real application) on real SQLite and
PostgreSQL outboxes: login, the overview, the incomplete events, the actions through the
CLI's code and their audit trail, and what a read-only user and a forged form are refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import httpx
import pytest

from tests.console.harness import Deployment, hidden, log_in
from tidings.events.outbox import EventStatus
from tidings.outbox.incomplete import EventFilter
from tidings.routing.table import add_route

pytestmark = pytest.mark.anyio


@pytest.fixture
def deployed(tmp_path: Path, database_url: str) -> Iterator[Deployment]:
    deployment = Deployment(tmp_path, database_url)
    yield deployment
    deployment.close()


def _poisoned(deployed: Deployment) -> str:
    """A FAILED poison event on key k with two events held behind it; its id."""
    deployed.emit(
        [
            ("orders.placed", "k", {"n": 1}),
            ("orders.placed", "k", {"n": "poison"}),
            ("orders.placed", "k", {"n": 3}),
            ("orders.placed", "other", {"n": 4}),
            ("orders.placed", "k", {"n": 5}),
        ]
    )
    deployed.relay(runs=3)
    (failed,) = deployed.state.events.find(EventFilter(statuses=frozenset({EventStatus.FAILED})))
    return failed.event_id


async def test_every_page_needs_a_login_and_a_wrong_password_is_refused(
    deployed: Deployment,
) -> None:
    async with deployed.client() as client:
        for path in ("/", "/events", "/audit", "/events/x"):
            reply = await client.get(path)
            assert reply.status_code == 303
            assert reply.headers["location"].startswith("/login?next=")
        form = await client.get("/login")
        assert form.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in form.headers["content-security-policy"]
        wrong = await client.post(
            "/login",
            data={"csrf": hidden(form.text, "csrf"), "user": "olga", "password": "nope"},
        )
        assert wrong.status_code == 401
        assert "wrong user name or password" in wrong.text
        assert "tidings_console=" not in wrong.headers.get("set-cookie", "")
        # a login form from elsewhere (no matching cookie) is refused too
        client.cookies.clear()
        forged = await client.post(
            "/login", data={"csrf": "made-up", "user": "olga", "password": "op-secret"}
        )
        assert forged.status_code == 403
        await log_in(client, "olga")
        assert (await client.get("/events")).status_code == 200
        # after logout the session is gone
        page = await client.get("/")
        await client.post("/logout", data={"csrf": hidden(page.text, "csrf")})
        assert (await client.get("/")).status_code == 303


async def test_the_session_cookie_is_http_only_and_strict(deployed: Deployment) -> None:
    async with deployed.client() as client:
        form = await client.get("/login")
        reply = await client.post(
            "/login",
            data={"csrf": hidden(form.text, "csrf"), "user": "rita", "password": "read-secret"},
        )
        cookie = reply.headers["set-cookie"].lower()
        assert "tidings_console=" in cookie and "httponly" in cookie
        assert "samesite=strict" in cookie


async def test_a_login_goes_back_to_the_page_asked_for_but_never_off_site(
    deployed: Deployment,
) -> None:
    async with deployed.client() as client:
        for asked, landed in (
            ("/events?status=FAILED", "/events?status=FAILED"),
            ("https://evil.example/", "/"),
            ("//evil.example/", "/"),
        ):
            client.cookies.clear()
            form = await client.get("/login", params={"next": asked})
            reply = await client.post(
                "/login",
                data={
                    "csrf": hidden(form.text, "csrf"),
                    "next": hidden(form.text, "next").replace("&amp;", "&"),
                    "user": "rita",
                    "password": "read-secret",
                },
            )
            assert reply.headers["location"] == landed


async def test_the_overview_shows_the_failed_event_and_the_key_it_holds(
    deployed: Deployment,
) -> None:
    poison = _poisoned(deployed)
    deployed.sample()
    async with deployed.client() as client:
        await log_in(client, "rita")
        page = (await client.get("/")).text
    assert re.search(r'data-status="FAILED"><a [^>]*>1<', page)
    assert re.search(r'data-status="HELD"><a [^>]*>2<', page)
    assert re.search(r'id="held-keys">1<', page)
    assert f'href="/events/{poison}"' in page  # the blocking event, linked
    assert 'data-part="target.store"' in page
    assert "<svg" in page


async def test_the_overview_says_when_the_outbox_database_is_down(tmp_path: Path) -> None:
    deployed = Deployment(tmp_path, "postgresql://postgres@127.0.0.1:1/none")
    try:
        deployed.sample()
        async with deployed.client() as client:
            await log_in(client, "rita")
            page = (await client.get("/")).text
        assert "outbox database:" in page
    finally:
        deployed.close()


async def test_the_list_filters_and_pages_and_refuses_a_bad_filter(deployed: Deployment) -> None:
    poison = _poisoned(deployed)
    deployed.state.settings = deployed.state.settings.model_copy(update={"page_size": 1})
    async with deployed.client() as client:
        await log_in(client, "rita")
        failed = await client.get("/events", params={"status": "failed"})
        assert poison in failed.text and failed.text.count("data-event=") == 1
        held = await client.get("/events", params={"status": "HELD", "key": "k"})
        assert held.text.count("data-event=") == 1  # a page of one
        following = re.search(r'href="([^"]*)" id="next"', held.text)
        assert following is not None
        second = await client.get(following.group(1).replace("&amp;", "&"))
        assert second.text.count("data-event=") == 1
        assert 'id="next"' not in second.text  # two HELD events: no third page
        none = await client.get("/events", params={"event_type": "payments.*"})
        assert 'id="none"' in none.text
        bad = await client.get("/events", params={"status": "LOST"})
        assert bad.status_code == 400 and "status: 'LOST' is not one of" in unescape(bad.text)
        bad = await client.get("/events", params={"target": "nowhere"})
        assert bad.status_code == 400 and "'nowhere' is not a target" in unescape(bad.text)
        bad = await client.get("/events", params={"older_than": "soon"})
        assert bad.status_code == 400 and "not a duration" in bad.text


async def test_an_event_page_shows_payload_headers_and_each_target_s_error(
    deployed: Deployment,
) -> None:
    poison = _poisoned(deployed)
    async with deployed.client() as client:
        await log_in(client, "rita")
        page = unescape((await client.get(f"/events/{poison}")).text)
        missing = await client.get("/events/no-such-event")
    assert '"n": "poison"' in page
    assert 'id="status">FAILED' in page
    assert "refused" in page  # the target's error
    assert "Your role is <em>read</em>" in page and 'id="park"' not in page
    assert missing.status_code == 404


async def test_an_operator_parks_the_poison_and_its_key_flows_on(deployed: Deployment) -> None:
    poison = _poisoned(deployed)
    async with deployed.client() as client:
        csrf = await log_in(client, "olga")
        asked = {"csrf": csrf, "action": "park", "subject": poison, "reason": "bad n, ticket 7"}
        confirm = await client.post("/act", data=asked)
        assert confirm.status_code == 200 and 'id="confirm"' in confirm.text
        assert deployed.state.events.find()[0].status.value == "FAILED"  # not yet
        done = await client.post("/act", data={**asked, "confirmed": "yes"})
        assert done.status_code == 200 and f"parked {poison}" in done.text
        deployed.relay()  # the relay's next carry-over
        assert deployed.state.events.find()[0].status.value == "PARKED"
        assert len(deployed.state.events.find()) == 1  # the held events were published
        trail = (await client.get("/audit")).text
        assert "olga" in trail and "park" in trail and "bad n, ticket 7" in trail
        event = (await client.get(f"/events/{poison}")).text
        assert "parked: bad n, ticket 7" in event and 'id="unpark"' in event
        deployed.refusing.word = "never-matches"  # the target was fixed
        unpark = {"csrf": csrf, "action": "unpark", "subject": poison, "confirmed": "yes"}
        assert "unparked and resubmitted" in (await client.post("/act", data=unpark)).text
        deployed.relay()
        assert deployed.state.events.find() == []


async def test_actions_are_refused_to_a_read_only_user_and_to_a_forged_form(
    deployed: Deployment,
) -> None:
    poison = _poisoned(deployed)
    async with deployed.client() as client:
        csrf = await log_in(client, "rita")
        asked = {
            "csrf": csrf,
            "action": "park",
            "subject": poison,
            "reason": "r",
            "confirmed": "yes",
        }
        refused = await client.post("/act", data=asked)
        assert refused.status_code == 403
        assert "user rita has the read role: only operators may act" in refused.text
    async with deployed.client() as client:
        await log_in(client, "olga")
        forged = await client.post("/act", data={**asked, "csrf": "not-the-token"})
        assert forged.status_code == 403 and "did not come from this session" in forged.text
        no_reason = await client.post("/act", data={**asked, "csrf": csrf, "reason": ""})
        assert no_reason.status_code in (400, 403)
    assert deployed.state.events.find()[0].status.value == "FAILED"
    assert deployed.state.audit.newest() == []


async def test_unroutable_events_are_redriven_after_their_route_is_added(
    deployed: Deployment,
) -> None:
    deployed.emit([("payments.made", "p", {"n": 1}), ("payments.made", "p", {"n": 2})])
    deployed.relay()
    deployed.sample()
    async with deployed.client() as client:
        csrf = await log_in(client, "olga")
        overview = (await client.get("/")).text
        assert 'id="unroutable"' in overview and "payments.made" in overview
        add_route(deployed.engine, "payments.*", "store")
        done = await client.post(
            "/act",
            data={"csrf": csrf, "action": "redrive", "subject": "payments.*", "confirmed": "yes"},
        )
        assert "re-drove 2 UNROUTABLE event(s) of payments.*" in done.text
    deployed.relay()
    assert deployed.state.events.find() == []


async def test_the_routes_page_shows_sources_and_adds_a_route_through_the_cli_s_code(
    deployed: Deployment,
) -> None:
    deployed.emit([("payments.made", "p", {"n": 1})])
    deployed.relay()
    async with deployed.client() as client:
        csrf = await log_in(client, "olga")
        page = (await client.get("/routes")).text
        assert 'data-route="orders.*"' in page and 'id="unroutable-total">1<' in page
        asked = {"csrf": csrf, "action": "route", "subject": "payments.*", "target": "store"}
        confirm = (await client.post("/act", data=asked)).text
        assert "1 UNROUTABLE event(s) match it" in confirm
        done = await client.post("/act", data={**asked, "confirmed": "yes"})
        assert "payments.* -&gt; store added" in done.text and 'id="redrive"' in done.text
        page = (await client.get("/routes")).text
        assert re.search(
            r'data-route="payments\.\*">.*?<td>store</td><td></td><td>store</td>', page
        )
        unknown = await client.post("/act", data={**asked, "target": "nowhere", "confirmed": "yes"})
        assert unknown.status_code == 400 and "unknown target" in unescape(unknown.text)
        bad = await client.post("/act", data={**asked, "subject": "a*b*", "confirmed": "yes"})
        assert bad.status_code == 400 and "holds a '*'" in unescape(bad.text)
    trail = deployed.state.audit.newest()
    assert [(e.action, e.target) for e in trail][-1] == ("route", "payments.* -> store")
    assert "error" in trail[0].detail  # the refused ones are recorded too


async def test_an_address_failing_too_many_logins_is_refused_for_a_while(tmp_path: Path) -> None:
    deployed = Deployment(tmp_path, f"sqlite:///{tmp_path / 'outbox.db'}", max_failed_logins=2)
    try:
        async with deployed.client() as client:

            async def attempt(password: str) -> httpx.Response:
                form = await client.get("/login")
                data = {"csrf": hidden(form.text, "csrf"), "user": "olga", "password": password}
                return await client.post("/login", data=data)

            assert (await attempt("wrong-1")).status_code == 401
            assert (await attempt("wrong-2")).status_code == 401
            refused = await attempt("op-secret")  # the right one, but not now
            assert refused.status_code == 429
            assert "too many failed logins from this address" in refused.text
    finally:
        deployed.close()


async def test_a_live_tail_of_a_source_the_file_does_not_have_is_refused(
    deployed: Deployment,
) -> None:
    async with deployed.client() as client:
        await log_in(client, "rita")
        bad = await client.get("/tail/stream", params={"source": "server:nowhere"})
        assert bad.status_code == 400 and "is not one of outbox" in unescape(bad.text)
        long = await client.get("/tail/stream", params={"types": "x" * 300})
        assert long.status_code == 400 and "too long" in long.text
        deployed.state.tails = 16  # as if 16 tails were open
        full = await client.get("/tail/stream")
        assert full.status_code == 503 and "16 live tails are open" in full.text
