"""casq: a durable job queue and pub/sub log whose whole state lives in object storage.

The generated protobuf messages and gRPC stubs of the API are in :mod:`casq.v1`.
"""
