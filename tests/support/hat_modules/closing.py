"""Closes itself when it is offered a ``('close',)`` event: a hat module ending on its own,
which ends hat's engine, and with it the server."""

from hat import aio
from hat.event.server import common

json_schema_id = None
json_schema_repo = None


async def create(conf, engine, source):
    module = ClosingModule()
    module._async_group = aio.Group()
    return module


class ClosingModule(common.Module):
    @property
    def async_group(self):
        return self._async_group

    @property
    def subscription(self):
        return common.Subscription([("close",)])

    async def process(self, source, event):
        self.close()
        return
        yield  # an asynchronous generator that yields nothing
