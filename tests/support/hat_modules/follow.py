"""Changes its subscription as it goes, as a hat module may: hat-event's engine reads
``module.subscription`` for every event it offers. On ``('follow', x)`` it subscribes to
``(x, '*')`` too, from the next event offered on, and answers every event it is offered
with ``('followed', *type)``."""

from hat import aio
from hat.event.server import common

json_schema_id = None
json_schema_repo = None


async def create(conf, engine, source):
    module = FollowModule()
    module._async_group = aio.Group()
    module._followed = [("follow", "*")]
    return module


class FollowModule(common.Module):
    @property
    def async_group(self):
        return self._async_group

    @property
    def subscription(self):
        return common.Subscription(self._followed)

    async def process(self, source, event):
        if event.event_type[0] == "follow":
            self._followed.append((event.event_type[1], "*"))
        yield common.RegisterEvent(
            event_type=("followed", *event.event_type),
            source_timestamp=None,
            payload=None,
        )
