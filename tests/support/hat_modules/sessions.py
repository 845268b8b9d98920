"""Counts the events it is offered in each session, from ``on_session_start`` to
``on_session_stop``, and answers each with its number in the session: the session calls of
hat's engine, observed. Defines no schema (``json_schema_id`` None), as hat allows."""

from hat import aio
from hat.event.server import common

json_schema_id = None
json_schema_repo = None


async def create(conf, engine, source):
    module = SessionsModule()
    module._async_group = aio.Group()
    module._subscription = common.Subscription([tuple(t) for t in conf["subscriptions"]])
    module._session = None
    module._count = 0
    module._stopped = []
    return module


class SessionsModule(common.Module):
    @property
    def async_group(self):
        return self._async_group

    @property
    def subscription(self):
        return self._subscription

    async def on_session_start(self, session_id):
        self._session = session_id
        self._count = 0

    async def on_session_stop(self, session_id):
        self._stopped.append(session_id == self._session)
        self._session = None

    async def process(self, source, event):
        self._count += 1
        yield common.RegisterEvent(
            event_type=("counted", *event.event_type),
            source_timestamp=None,
            payload=common.EventPayload(
                type=common.EventPayloadType.JSON,
                data={
                    "n": self._count,
                    "in_session": self._session == event.event_id.session,
                    "stops_matched": all(self._stopped),
                },
            ),
        )
