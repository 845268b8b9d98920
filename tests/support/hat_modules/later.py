"""Registers later, outside the session, with the engine it was given: for each ``('later',
x)`` event a task of its own registers ``('later-done', x)`` on behalf of the module's
Source, then queries the engine for the events of both types."""

from hat import aio
from hat.event.server import common

json_schema_id = None
json_schema_repo = None


async def create(conf, engine, source):
    module = LaterModule()
    module._async_group = aio.Group()
    module._engine = engine
    module._source = source
    return module


class LaterModule(common.Module):
    @property
    def async_group(self):
        return self._async_group

    @property
    def subscription(self):
        return common.Subscription([("later", "*")])

    async def process(self, source, event):
        self.async_group.spawn(self._later, event.event_type[1:])
        return
        yield  # an asynchronous generator that yields nothing

    async def _later(self, rest):
        done = common.RegisterEvent(
            event_type=("later-done", *rest),
            source_timestamp=None,
            payload=common.EventPayload(type=common.EventPayloadType.JSON, data=list(rest)),
        )
        [registered] = await self._engine.register(self._source, [done])
        found = await self._engine.query(
            common.QueryData(event_types=[("later", *rest), ("later-done", *rest)])
        )
        await self._engine.register(
            self._source,
            [
                common.RegisterEvent(
                    event_type=("later-found", *rest),
                    source_timestamp=None,
                    payload=common.EventPayload(
                        type=common.EventPayloadType.JSON,
                        data={
                            "types": sorted(list(e.event_type) for e in found),
                            "registered": list(registered.event_type),
                        },
                    ),
                )
            ],
        )
