"""A PredictionService that answers every Predict with an empty response and runs no model: the
cost of the gRPC round trip alone (the stock Python client on this machine; the server: grpcio's
stock server, or `inline`: the server loopline serves on, serving/grpc_transport.py), so the
serving benchmark can split our overhead into transport and handler.

    python -m bench.grpc_floor PORT [CPU [WORKERS [inline]]]   (CPU: pin the process to it, as the
    bench pins ours; WORKERS: gRPC worker threads, 32 by default, serving.grpc_workers' default)
"""
from __future__ import annotations

import os
import sys
from concurrent import futures

import grpc
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc


class EmptyPredictions(prediction_service_pb2_grpc.PredictionServiceServicer):
    def Predict(self, request, context):
        response = predict_pb2.PredictResponse()
        response.model_spec.name = request.model_spec.name
        return response


def main(port: int, workers: int = 32, inline: bool = False) -> None:
    if inline:
        from serving.grpc_transport import InlineServer

        server = InlineServer(workers, [])
    else:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(EmptyPredictions(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("serving", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    if len(sys.argv) > 2:
        os.sched_setaffinity(0, {int(sys.argv[2])})
    main(int(sys.argv[1]), *(int(a) for a in sys.argv[3:4]), inline=sys.argv[4:5] == ["inline"])
