"""Subscribers' side in Python: :mod:`.subscriber` says what any subscriber does (the
protocol the callers depend on, and the frames it receives); :mod:`.client` subscribes at
one intermediary; :mod:`.handover` subscribes at a cluster of them, following redirects and
handovers so that each subscription's frames form one stream.

``from tidings.intermediary.client import IntermediaryClient`` is the documented way in, with
:class:`Credentials` (a token, or a user and password) for an intermediary that asks for them.
"""

from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.serving.credentials import Credentials

__all__ = ["Credentials", "IntermediaryClient"]
