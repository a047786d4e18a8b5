"""Big-endian fixed-size numbers as the wire formats here write them (AMQP 0-9-1 and the
RabbitMQ Stream protocol): one shared ``struct.Struct`` per shape. Nothing else."""
import struct

U8 = struct.Struct(">B")
I8 = struct.Struct(">b")
U16 = struct.Struct(">H")
I16 = struct.Struct(">h")
U32 = struct.Struct(">I")
I32 = struct.Struct(">i")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
F32 = struct.Struct(">f")
F64 = struct.Struct(">d")
