"""Queries the engine inside ``process``, as hat modules that derive a value from the stored
state do: for each ``('n', x)`` event it registers ``('seen', x)`` with the number of
``('n', ?)`` events the query found (hat-event stores every session before it runs the
next, so the earlier sessions are all found, the current one not)."""

from hat import aio
from hat.event.server import common

json_schema_id = None
json_schema_repo = None


async def create(conf, engine, source):
    module = QueryModule()
    module._async_group = aio.Group()
    module._engine = engine
    return module


class QueryModule(common.Module):
    @property
    def async_group(self):
        return self._async_group

    @property
    def subscription(self):
        return common.Subscription([("n", "?")])

    async def process(self, source, event):
        found = await self._engine.query(common.QueryData(event_types=[("n", "?")]))
        yield common.RegisterEvent(
            event_type=("seen", *event.event_type[1:]),
            source_timestamp=None,
            payload=common.EventPayload(type=common.EventPayloadType.JSON, data=len(found)),
        )
