"""tvm-dpu: compile CNNs for the Xilinx DPUCZDX8G (ISA1) accelerator through TVM Relax BYOC."""
__version__ = "0.1.0"
