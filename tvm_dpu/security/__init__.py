"""What a user loads and whether to trust it: the checksummed container format of artifacts, the bytes of a
compiled DPU subgraph inside TVM's library, bounded reads of regular files, Ed25519 signing and the trust policy.
Nothing here executes anything from a file."""
