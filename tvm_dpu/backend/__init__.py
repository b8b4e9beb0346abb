"""The DPU backend behind the Relax side (tvm_dpu.passes): the "dpu" Relax pipeline (`relax_pipeline`),
`relax.ext.dpu`, which quantizes and compiles each partition to a DPU program (`dpu_compile`) and embeds it in a
small native module (`ext_module`), large-conv splitting on the XGraph (`split_conv`) and a subgraph cut into
segments for several DPU cores (`multicore`)."""
