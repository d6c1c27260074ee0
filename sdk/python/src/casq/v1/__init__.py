"""Generated protobuf messages and gRPC stubs of the casq.v1 API.

The ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` modules in this package are
generated from ``proto/casq/v1/*.proto`` by ``scripts/generate.sh``; do not edit
them by hand. This ``__init__.py`` is hand-written and kept by the generator.
"""
