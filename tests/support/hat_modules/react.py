"""Answers each event it is subscribed to with one event under ``prefix``: hat's typical
module. The payload says what it reacted to and on whose behalf (the Source), so that the
processing order, the rounds and the sources can be compared between servers."""

from hat import aio, json
from hat.event.server import common

json_schema_id = "tidings-test://react.yaml#"
json_schema_repo = json.SchemaRepository(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "id": "tidings-test://react.yaml#",
        "type": "object",
        "required": ["module", "subscriptions", "prefix"],
        "properties": {
            "module": {"type": "string"},
            "subscriptions": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "string"}},
            },
            "prefix": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        },
    }
)


async def create(conf, engine, source):
    module = ReactModule()
    module._async_group = aio.Group()
    module._subscription = common.Subscription([tuple(t) for t in conf["subscriptions"]])
    module._prefix = tuple(conf["prefix"])
    module._source = source
    return module


class ReactModule(common.Module):
    @property
    def async_group(self):
        return self._async_group

    @property
    def subscription(self):
        return self._subscription

    async def process(self, source, event):
        payload = event.payload
        yield common.RegisterEvent(
            event_type=(*self._prefix, *event.event_type[1:]),
            source_timestamp=event.source_timestamp,
            payload=common.EventPayload(
                type=common.EventPayloadType.JSON,
                data={
                    "from": list(event.event_type),
                    "source": [source.type.name, source.id],
                    "me": [self._source.type.name, self._source.id],
                    "payload_type": None if payload is None else payload.type.name,
                    "data": payload.data
                    if payload is not None and payload.type == common.EventPayloadType.JSON
                    else None,
                },
            ),
        )
