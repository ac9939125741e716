"""RocketMQ 4.x remoting protocol: frames, JSON and ROCKETMQ binary headers, fastjson bodies, codes."""
from . import fastjson
from .codes import (LanguageCode, RequestCode, ResponseCode, SerializeType, code_name)
from .command import (MAX_FRAME_LENGTH, FrameDecoder, FrameError, FrameTooLarge, RemotingCommand, RemotingError,
                      decode_frame)

__all__ = ["fastjson", "LanguageCode", "RequestCode", "ResponseCode", "SerializeType", "code_name",
           "MAX_FRAME_LENGTH", "FrameDecoder", "FrameError", "FrameTooLarge", "RemotingCommand", "RemotingError",
           "decode_frame"]
