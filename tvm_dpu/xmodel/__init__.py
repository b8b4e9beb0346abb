"""AMD's .xmodel format (an XIR graph serialized with XIR's public `graph_proto_v2` protobuf schema)."""
