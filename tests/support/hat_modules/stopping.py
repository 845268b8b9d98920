"""Registers from ``on_session_start`` and ``on_session_stop``, as a hat module may: for a
session holding ``('s', x)`` events it registers ``('stopped', x)`` from
``on_session_stop``, and it remembers the session ids it was told at ``on_session_start``;
the registration is spawned (awaiting it there would wait for the session itself), so it is
a session of its own after this one, on behalf of the module."""

from hat import aio
from hat.event.server import common

json_schema_id = None
json_schema_repo = None


async def create(conf, engine, source):
    module = StoppingModule()
    module._async_group = aio.Group()
    module._engine = engine
    module._source = source
    module._started = None
    module._seen = []
    return module


class StoppingModule(common.Module):
    @property
    def async_group(self):
        return self._async_group

    @property
    def subscription(self):
        return common.Subscription([("s", "?")])

    async def on_session_start(self, session_id):
        self._started = session_id
        self._seen = []

    async def process(self, source, event):
        self._seen.append(event.event_type[1])
        return
        yield  # an asynchronous generator that yields nothing

    async def on_session_stop(self, session_id):
        events = [
            common.RegisterEvent(
                event_type=("stopped", x),
                source_timestamp=None,
                payload=common.EventPayload(
                    type=common.EventPayloadType.JSON,
                    data={"same_session": session_id == self._started},
                ),
            )
            for x in self._seen
        ]
        if events:
            self.async_group.spawn(self._engine.register, self._source, events)
