// tvm-dpu's checker of an .xmodel against AMD's XIR library (libxir, e.g. Debian's libxir-dev 2.5).
//
//   xir_check FILE [OUT]
//
// Loads FILE with xir::Graph::deserialize, which checks every op against XIR's built-in op definitions and aborts
// on a missing REQUIRED attribute. With OUT, writes the loaded graph back with Graph::serialize before anything
// else touches it (a round trip through XIR). Then re-runs XIR's shape inference on every op in topological order
// and compares the inferred output shape with the file's. Prints one JSON object per line on stdout:
//   {"event":"loaded",...}                 the graph loaded
//   {"event":"subgraph",...}               every subgraph, root first, children in XIR's topological order
//   {"event":"infer","op":...}             before each op's shape inference (names the op if XIR aborts in it)
//   {"event":"op",...}                     file shape, inferred shape, device and DDR attributes of its output
//   {"event":"done","mismatches":N}
// Exit status: 0 when every inferred shape equals the file's, 1 on a mismatch; XIR's own aborts end the process
// with its message on stderr (the Python side reports it).
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <xir/graph/graph.hpp>
#include <xir/graph/subgraph.hpp>
#include <xir/op/op.hpp>
#include <xir/tensor/tensor.hpp>

namespace {

std::string quote(const std::string& s) {
  std::ostringstream o;
  o << '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o << '\\' << c;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o << buf;
    } else {
      o << c;
    }
  }
  o << '"';
  return o.str();
}

std::string ints(const std::vector<std::int32_t>& v) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
  o << ']';
  return o.str();
}

// A string attribute, or "" when absent or of another type (XIR keeps `device` as a string attribute).
template <typename T>
std::string str_attr(const T* obj, const std::string& key) {
  if (!obj->has_attr(key)) return "";
  try {
    return std::any_cast<std::string>(obj->get_attr(key));
  } catch (const std::bad_any_cast&) {
    return "";
  }
}

// `"key":value` for an int32 tensor attribute that is present, else "" (VART reads reg_id/ddr_addr/location so).
std::string int_attr(const xir::Tensor* t, const std::string& key) {
  if (!t->has_attr(key)) return "";
  try {
    return "," + quote(key) + ":" + std::to_string(std::any_cast<std::int32_t>(t->get_attr(key)));
  } catch (const std::bad_any_cast&) {
    return "," + quote(key) + ":\"not int32\"";
  }
}

void walk(const xir::Subgraph* sg, const std::string& parent, int depth) {
  std::vector<const xir::Subgraph*> kids;
  if (!sg->is_leaf()) kids = sg->children_topological_sort();
  std::cout << "{\"event\":\"subgraph\",\"name\":" << quote(sg->get_name()) << ",\"parent\":" << quote(parent)
            << ",\"depth\":" << depth << ",\"device\":" << quote(str_attr(sg, "device"))
            << ",\"ops\":" << sg->get_op_num() << ",\"children\":" << kids.size() << "}\n";
  for (const auto* k : kids) walk(k, sg->get_name(), depth + 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: xir_check FILE [OUT]\n";
    return 2;
  }
  auto graph = xir::Graph::deserialize(argv[1]);
  std::cout << "{\"event\":\"loaded\",\"graph\":" << quote(graph->get_name()) << ",\"ops\":" << graph->get_op_num()
            << "}\n";
  if (argc == 3) {
    graph->serialize(argv[2]);
    std::cout << "{\"event\":\"serialized\",\"path\":" << quote(argv[2]) << "}\n";
  }
  walk(graph->get_root_subgraph(), "", 0);
  std::cout.flush();
  int mismatches = 0;
  for (auto* op : graph->topological_sort()) {
    const auto* t = op->get_output_tensor();
    const auto before = t->get_shape();
    // read as the file has them: some ops' shape_infer replaces the tensor without its attributes
    const auto ddr = int_attr(t, "reg_id") + int_attr(t, "ddr_addr") + int_attr(t, "location");
    const auto dtype = t->get_data_type().to_string();
    std::cout << "{\"event\":\"infer\",\"op\":" << quote(op->get_name()) << "}" << std::endl;
    op->shape_infer();
    const auto after = op->get_output_tensor()->get_shape();
    mismatches += after != before;
    std::cout << "{\"event\":\"op\",\"name\":" << quote(op->get_name()) << ",\"type\":" << quote(op->get_type())
              << ",\"device\":" << quote(str_attr(op, "device")) << ",\"shape\":" << ints(before)
              << ",\"inferred\":" << ints(after) << ",\"dtype\":" << quote(dtype) << ddr << "}\n";
  }
  std::cout << "{\"event\":\"done\",\"mismatches\":" << mismatches << "}" << std::endl;
  return mismatches ? 1 : 0;
}
