"""The gRPC side of the gate: a grpc.aio server interceptor that checks every request message of every call
(RocketMQ 5's AuthenticationInterceptor) before the servicer sees it; a refusal ends the call with gRPC
status PERMISSION_DENIED (7) and the refusal's message as details. Needs grpcio (the `grpc` extra)."""
from __future__ import annotations

import grpc


def _metadata(context) -> dict[str, str]:
    out = {}
    for item in context.invocation_metadata() or ():
        k, v = item[0], item[1]
        if isinstance(v, str):
            out[k.lower()] = v
    return out


class AclInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, check):
        """check(message, metadata, peer) -> None, or the refusal's message."""
        self.check = check

    async def _gate(self, request, context) -> None:
        """Ends the call with PERMISSION_DENIED when request may not go on."""
        refusal = self.check(request, _metadata(context), context.peer())
        if refusal is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        check, gate = self.check, self._gate
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request, context):
                await gate(request, context)
                return await inner_uu(request, context)
            return grpc.unary_unary_rpc_method_handler(unary_unary, **kw)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request, context):
                await gate(request, context)
                async for r in inner_us(request, context):
                    yield r
            return grpc.unary_stream_rpc_method_handler(unary_stream, **kw)
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream

            async def stream_stream(request_iterator, context):
                metadata, peer = _metadata(context), context.peer()
                refused: list[str] = []

                async def checked():
                    async for m in request_iterator:
                        refusal = check(m, metadata, peer)
                        if refusal is not None:
                            refused.append(refusal)
                            return
                        yield m
                async for r in inner_ss(checked(), context):
                    if refused:
                        break
                    yield r
                if refused:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused[0])
            return grpc.stream_stream_rpc_method_handler(stream_stream, **kw)
        return handler          # stream-unary: no such RPC in the protocol
