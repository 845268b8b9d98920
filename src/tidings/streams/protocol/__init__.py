"""What goes over a stream's wire: FutoIn FTN3 messages, the FTN18 interfaces and their
parameter checks, server events encoded as FTN18 events, and the bi-directional channel a
WebSocket is in FTN3's terms.

Pure protocol, no store and no server: the stream service, the Python consumer and the
Spark source all speak it.
"""
