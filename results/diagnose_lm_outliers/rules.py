import fp4lab as fl


def kept(base, hp, *gemms):  # recipe `base` with these GEMMs in `hp`
    name = base + "".join(f"+{g}={hp}" for g in gemms)
    return fl.recipes.override(fl.recipes.get(base), dict.fromkeys(gemms, hp)).replace(name=name)


rules = [
    fl.Rule(r"blocks\.2\.up", kept("nvfp4", "bf16", "fprop")),
    fl.Rule(r"blocks\.1\.down", kept("nvfp4", "bf16", "fprop")),
    fl.Rule(r"blocks\.0\.attn\.value", kept("nvfp4", "bf16", "fprop")),
    fl.Rule(r"head", kept("nvfp4", "bf16", "dgrad")),
    fl.Rule(r"blocks\.3\.up", kept("nvfp4", "bf16", "fprop")),
    fl.Rule(r".*", "nvfp4"),
]
