"""Answers each event with the id and timestamp it was shown with, as hat-event shows a
module the id and timestamp the event is stored under."""

from hat import aio
from hat.event.server import common

json_schema_id = None
json_schema_repo = None


async def create(conf, engine, source):
    module = IdsModule()
    module._async_group = aio.Group()
    module._subscription = common.Subscription([tuple(t) for t in conf["subscriptions"]])
    return module


class IdsModule(common.Module):
    @property
    def async_group(self):
        return self._async_group

    @property
    def subscription(self):
        return self._subscription

    async def process(self, source, event):
        yield common.RegisterEvent(
            event_type=("id-of", *event.event_type),
            source_timestamp=None,
            payload=common.EventPayload(
                type=common.EventPayloadType.JSON,
                data={
                    "id": list(event.event_id),
                    "timestamp": [event.timestamp.s, event.timestamp.us],
                },
            ),
        )
