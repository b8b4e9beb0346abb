"""The DPU architecture description: one immutable dataclass, filled from data (presets.json / arch.json).

Everything downstream (limits, codegen, emulator, timing) reads hardware parameters from an `Arch`;
nothing else hard-codes PP/ICP/OCP or bank ids.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BankGroup:
    """A group of on-chip banks with consecutive ids (isa1-semantics.md 2.2)."""

    name: str  # "VB0", "VB1", ..., "CONVW", "DWCONVW", "BIAS"
    kind: str  # "image" or "param"
    base_id: int
    count: int
    width: int  # bytes per row (ICP)
    depth: int  # rows (bank_depth)

    @property
    def ids(self) -> range:
        return range(self.base_id, self.base_id + self.count)


@dataclass(frozen=True)
class Arch:
    """One DPU configuration (one core) plus the board it sits on.

    Hardware fields follow the Vitis AI target description (dpu-facts.md, isa1-semantics.md 2.2).
    Board fields (clock, cores, DDR bandwidth) come from the board preset; a bare DPU preset carries
    defaults that the timing model may use.
    """

    name: str  # e.g. "DPUCZDX8G_ISA1_B4096", "zcu102", "dnnvm-zu2"
    family: str  # "DPUCZDX8G"
    isa: int  # ISA version (1 for ISA1)
    arch_index: int  # fingerprint bits 3:0 (0..7 = B512..B4096)
    pp: int  # pixel parallelism of the conv engine
    icp: int  # input channel parallelism (= bank width in bytes)
    ocp: int  # output channel parallelism
    alu_pp: int  # pixel parallelism of the ALU / eltwise engines
    bank_depth: int = 2048
    img_bank_groups: int = 2
    channel_augmentation: bool = True
    conv_leaky: bool = True  # CONV may use LeakyReLU (fingerprint bit 28)
    dw_leaky: bool = False  # ALU/depthwise may use LeakyReLU (fingerprint bit 29)
    save_argmax: bool = False  # fingerprint bit 30
    # Activation codes (dpu-facts.md: 0 none, 1 relu, 2 prelu, 3 leaky, 4 relu6, 5 hsigmoid, 6 hswish)
    conv_activations: tuple[str, ...] = ("relu", "leaky_relu", "relu6")
    alu_activations: tuple[str, ...] = ("relu", "relu6")
    elew_activations: tuple[str, ...] = ("relu",)
    # Board / system parameters
    freq_mhz: float = 300.0
    cores: int = 1
    ddr_bytes_per_s: float = 17.1e9
    onchip_bytes: int | None = None  # informational (DNNVM boards quote total on-chip memory)
    board: str | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    # ---- derived quantities -------------------------------------------------------------
    @property
    def dpu_name(self) -> str:
        """The Vitis AI target name of the core, e.g. DPUCZDX8G_ISA1_B4096."""
        return f"{self.family}_ISA{self.isa}_B{self.ops_per_clock}"

    @property
    def ops_per_clock(self) -> int:
        return self.pp * self.icp * self.ocp * 2

    @property
    def peak_gops(self) -> float:
        """Peak GOPS of one core at the board clock."""
        return self.ops_per_clock * self.freq_mhz * 1e6 / 1e9

    @property
    def channel_parallel(self) -> int:
        """`channel_parallel` of the Vitis AI limits table (= ICP)."""
        return self.icp

    @property
    def bank_groups(self) -> tuple[BankGroup, ...]:
        """Bank groups in target-factory order: VB0..VB(n-1) (PP banks each), CONVW (OCP), DWCONVW (1), BIAS (1)."""
        groups: list[BankGroup] = []
        base = 0
        for g in range(self.img_bank_groups):
            groups.append(BankGroup(f"VB{g}", "image", base, self.pp, self.icp, self.bank_depth))
            base += self.pp
        for name, count in (("CONVW", self.ocp), ("DWCONVW", 1), ("BIAS", 1)):
            groups.append(BankGroup(name, "param", base, count, self.icp, self.bank_depth))
            base += count
        return tuple(groups)

    def bank_group(self, name: str) -> BankGroup:
        for g in self.bank_groups:
            if g.name == name:
                return g
        raise KeyError(f"{self.name} has no bank group {name!r}")

    @property
    def num_banks(self) -> int:
        last = self.bank_groups[-1]
        return last.base_id + last.count
