"""XIR's graph schema (serial_v2, `graph_proto_v2.proto` in AMD's public XIR sources) as field tables.

Written from the schema's field numbers and types (facts), not from AMD's .proto file or generated code. The reader
(reader.py) decodes with these tables and a writer encodes with the same ones: this module is the one place the
schema is stated.

MESSAGES: message name -> {field number: Field}. A Field's `kind` is a scalar kind (string, bytes, bool, int32,
uint32, int64, uint64, float, double, enum), "message" (then `message` names its type) or "map" (keys are
strings; `value_kind` / `message` give the value). Repeated scalars may arrive packed or not.
"""
from __future__ import annotations

from dataclasses import dataclass

#: scalar kind -> protobuf wire type
WIRE_OF_KIND = {"string": 2, "bytes": 2, "message": 2, "map": 2, "bool": 0, "int32": 0, "uint32": 0, "int64": 0,
                "uint64": 0, "enum": 0, "float": 5, "double": 1}


@dataclass(frozen=True)
class Field:
    name: str
    kind: str
    message: str | None = None
    repeated: bool = False
    value_kind: str | None = None  # map fields only


def _f(name: str, kind: str, message: str | None = None, repeated: bool = False) -> Field:
    return Field(name, kind, message, repeated)


def _map(name: str, value_kind: str, message: str | None = None) -> Field:
    return Field(name, "map", message, True, value_kind)


MESSAGES: dict[str, dict[int, Field]] = {
    "Graph": {1: _f("graph_name", "string"), 5: _f("op_node", "message", "OPNode", True),
              10: _f("subg_root", "message", "SubGraph"), 11: _map("graph_attr", "message", "AttrValue"),
              101: _f("op_defs", "message", "OpDef", True)},
    "OPNode": {1: _f("op_name", "string"), 2: _f("op_type", "string"), 3: _map("op_attr", "message", "AttrValue"),
               4: _f("args", "message", "OpArg", True), 5: _f("output_tensor", "message", "Tensor")},
    "OpArg": {1: _f("arg_name", "string"), 2: _f("arg_ops", "string", repeated=True)},
    "Tensor": {1: _f("tensor_name", "string"), 2: _f("tensor_dim", "uint32", repeated=True),
               5: _f("data_type", "int32"), 6: _f("tensor_bit_width", "int32"),
               10: _map("tensor_attr", "message", "AttrValue")},
    "SubGraph": {1: _f("subgraph_name", "string"), 3: _f("op_name", "string", repeated=True),
                 5: _map("subg_attr", "message", "AttrValue"), 10: _f("subg_child", "message", "SubGraph", True)},
    "OpDef": {1: _f("name", "string"), 2: _f("input_args", "message", "OpArgDef", True),
              3: _f("attrs", "message", "AttrDef", True), 4: _f("annotation", "string")},
    "AttrDef": {1: _f("name", "string"), 3: _f("occur_type", "enum"), 4: _f("default_value", "message", "AttrValue"),
                6: _f("list_length", "int32"), 7: _f("annotation", "string")},
    "OpArgDef": {1: _f("name", "string"), 2: _f("occur_type", "enum"), 3: _f("data_type", "int32"),
                 4: _f("annotation", "string")},
    # a oneof: exactly one of these is set
    "AttrValue": {4: _f("bool_value", "bool"), 5: _f("int32_value", "int32"), 6: _f("uint32_value", "uint32"),
                  7: _f("int64_value", "int64"), 8: _f("uint64_value", "uint64"), 9: _f("float_value", "float"),
                  10: _f("double_value", "double"), 11: _f("string_value", "string"),
                  12: _f("bytes_value", "message", "Bytes"), 13: _f("bool_vec_value", "message", "BoolVec"),
                  14: _f("int32_vec_value", "message", "Int32Vec"),
                  15: _f("uint32_vec_value", "message", "Uint32Vec"),
                  16: _f("int64_vec_value", "message", "Int64Vec"),
                  17: _f("uint64_vec_value", "message", "Uint64Vec"),
                  18: _f("float_vec_value", "message", "FloatVec"),
                  19: _f("double_vec_value", "message", "DoubleVec"),
                  20: _f("string_vec_value", "message", "StringVec"),
                  21: _f("bytes_vec_value", "message", "BytesVec"),
                  22: _f("map_string_2_int32_value", "message", "MapString2Int32"),
                  23: _f("map_string_2_uint32_value", "message", "MapString2Uint32"),
                  24: _f("map_string_2_int64_value", "message", "MapString2Int64"),
                  25: _f("map_string_2_uint64_value", "message", "MapString2Uint64"),
                  26: _f("map_string_2_string_value", "message", "MapString2String"),
                  27: _f("map_string_2_bytes_value", "message", "MapString2Bytes"),
                  28: _f("map_string_2_int32_vec_value", "message", "MapString2Int32Vec"),
                  29: _f("map_string_2_uint32_vec_value", "message", "MapString2Uint32Vec"),
                  30: _f("map_string_2_int64_vec_value", "message", "MapString2Int64Vec"),
                  31: _f("map_string_2_uint64_vec_value", "message", "MapString2Uint64Vec"),
                  32: _f("map_string_2_string_vec_value", "message", "MapString2StringVec")},
    "Bytes": {1: _f("value", "bytes")},
    "BoolVec": {1: _f("value", "bool", repeated=True)},
    "Int32Vec": {1: _f("value", "int32", repeated=True)},
    "Uint32Vec": {1: _f("value", "uint32", repeated=True)},
    "Int64Vec": {1: _f("value", "int64", repeated=True)},
    "Uint64Vec": {1: _f("value", "uint64", repeated=True)},
    "FloatVec": {1: _f("value", "float", repeated=True)},
    "DoubleVec": {1: _f("value", "double", repeated=True)},
    "StringVec": {1: _f("value", "string", repeated=True)},
    "BytesVec": {1: _f("value", "message", "Bytes", True)},
    "MapString2Int32": {1: _map("value", "int32")},
    "MapString2Uint32": {1: _map("value", "uint32")},
    "MapString2Int64": {1: _map("value", "int64")},
    "MapString2Uint64": {1: _map("value", "uint64")},
    "MapString2Bytes": {1: _map("value", "message", "Bytes")},
    "MapString2String": {1: _map("value", "string")},
    "MapString2Int32Vec": {1: _map("value", "message", "Int32Vec")},
    "MapString2Uint32Vec": {1: _map("value", "message", "Uint32Vec")},
    "MapString2Int64Vec": {1: _map("value", "message", "Int64Vec")},
    "MapString2Uint64Vec": {1: _map("value", "message", "Uint64Vec")},
    "MapString2BytesVec": {1: _map("value", "message", "BytesVec")},
    "MapString2StringVec": {1: _map("value", "message", "StringVec")},
}

#: AttrValue's wrapper messages hold their payload in field 1 `value`: the attribute's Python value is that payload
#: (a list, a dict or bytes). Every AttrValue oneof field name -> the value's Python shape, for a writer.
WRAPPERS = frozenset(n for n in MESSAGES if n == "Bytes" or n.endswith("Vec") or n.startswith("MapString2"))
