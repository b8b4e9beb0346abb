"""AMD's .xmodel files (XIR graphs compiled by vai_c): read, run, inspect and report them.

    read_xmodel(path_or_bytes) -> XModel       the graph, its ops and the subgraph tree
    XModel.dpu_subgraphs() -> [DpuSubgraph]    machine code, regions and I/O of each DPU subgraph
"""
from .model import DpuSubgraph, Region, XModel, XOp, XSubgraph, XTensor, read_xmodel
from .reader import Attr, decode_graph
from .schema import MESSAGES, Field

__all__ = ["Attr", "DpuSubgraph", "Field", "MESSAGES", "Region", "XModel", "XOp", "XSubgraph", "XTensor",
           "decode_graph", "read_xmodel"]
