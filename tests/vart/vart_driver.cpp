// Drives AMD's XIR and VART libraries (Debian's libxir-dev / libvart-dev 2.5) on an .xmodel, as far as they go
// without a DPU: tests/test_vart_libraries.py builds this file and runs it. Only public VART / XIR API is called.
//
//   vart_driver FILE regs     XIR loads FILE; for every DPU subgraph, VART's zero-copy helper reads its region maps
//                             and places its input and output tensors (extract_reg_info_from_subgraph, which calls
//                             get_op_output_tensor_ddr on each), and the I/O buffer sizes and offsets.
//   vart_driver FILE runner   then vart::Runner::create_runner(subgraph, "run"): the DPU runner's session opens
//                             the DPU controller (XRT) first; the output says where that stops.
#include <iostream>
#include <string>
#include <vart/runner.hpp>
#include <vart/zero_copy_helper.hpp>
#include <xir/graph/graph.hpp>

static std::vector<const xir::Subgraph*> dpu_subgraphs(const xir::Graph* g) {
  std::vector<const xir::Subgraph*> out;
  for (auto* c : g->get_root_subgraph()->children_topological_sort()) {
    if (c->has_attr("device") && c->get_attr<std::string>("device") == "DPU") out.push_back(c);
  }
  return out;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: vart_driver FILE.xmodel regs|runner" << std::endl;
    return 2;
  }
  std::string mode = argv[2];
  auto graph = xir::Graph::deserialize(argv[1]);
  auto subgraphs = dpu_subgraphs(graph.get());
  std::cout << "xir loaded " << graph->get_name() << ": " << graph->get_op_num() << " ops, " << subgraphs.size()
            << " DPU subgraph(s)" << std::endl;
  for (auto* sg : subgraphs) {
    std::cout << "subgraph " << sg->get_name() << std::endl;
    for (auto* t : sg->get_sorted_input_tensors()) std::cout << "  input " << t->get_name() << std::endl;
    for (auto* t : sg->get_sorted_output_tensors()) std::cout << "  output " << t->get_name() << std::endl;
    for (auto& r : vart::extract_reg_info_from_subgraph(sg)) {
      if (r.type == vart::reg_type_t::INVALID) continue;
      std::cout << "  reg REG_" << r.reg_id << " " << vart::to_string(r.type) << " " << r.size << std::endl;
    }
    std::cout << "  input_buffer_size " << vart::get_input_buffer_size(sg) << std::endl;
    for (auto o : vart::get_input_offset(sg)) std::cout << "  input_offset " << o << std::endl;
    std::cout << "  output_buffer_size " << vart::get_output_buffer_size(sg) << std::endl;
    for (auto o : vart::get_output_offset(sg)) std::cout << "  output_offset " << o << std::endl;
  }
  std::cout << "regs done" << std::endl;
  if (mode == "runner") {
    for (auto* sg : subgraphs) {
      std::cout << "create_runner " << sg->get_name() << std::endl << std::flush;
      auto runner = vart::Runner::create_runner(sg, "run");
      std::cout << "runner created: " << runner->get_input_tensors().size() << " input tensor(s)" << std::endl;
    }
  }
  return 0;
}
