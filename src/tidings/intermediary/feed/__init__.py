"""The spatial feed: how an intermediary in its own process subscribes to a publisher of
moving entities over the wire. :mod:`.wire` is the protocol both sides speak (the control
messages and the binary batches); :mod:`.remote` is the intermediary's side, an upstream that
sends its boxes to the publisher and hands the batches it receives to the intermediary.
"""
