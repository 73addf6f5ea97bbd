import fp4lab as fl

rules = [
    fl.Rule('blocks\\.0\\.attn\\.out', fl.recipes.override(fl.recipes.get('nvfp4'), {'fprop': 'bf16', 'dgrad': 'bf16'}).replace(name='nvfp4+fprop=bf16+dgrad=bf16')),
    fl.Rule('blocks\\.0\\.attn\\.query', fl.recipes.override(fl.recipes.get('nvfp4'), {'fprop': 'bf16'}).replace(name='nvfp4+fprop=bf16')),
    fl.Rule('head', fl.recipes.override(fl.recipes.get('nvfp4'), {'fprop': 'bf16', 'dgrad': 'bf16'}).replace(name='nvfp4+fprop=bf16+dgrad=bf16')),
    fl.Rule('blocks\\.0\\.up', fl.recipes.override(fl.recipes.get('nvfp4'), {'fprop': 'bf16'}).replace(name='nvfp4+fprop=bf16')),
    fl.Rule('blocks\\.0\\.attn\\.value', fl.recipes.override(fl.recipes.get('nvfp4'), {'fprop': 'bf16'}).replace(name='nvfp4+fprop=bf16')),
    fl.Rule('blocks\\.0\\.attn\\.key', fl.recipes.override(fl.recipes.get('nvfp4'), {'fprop': 'bf16'}).replace(name='nvfp4+fprop=bf16')),
    fl.Rule('blocks\\.1\\.attn\\.out', fl.recipes.override(fl.recipes.get('nvfp4'), {'fprop': 'bf16'}).replace(name='nvfp4+fprop=bf16')),
    fl.Rule('blocks\\.1\\.attn\\.value', fl.recipes.override(fl.recipes.get('nvfp4'), {'fprop': 'bf16'}).replace(name='nvfp4+fprop=bf16')),
    fl.Rule('blocks\\.2\\.attn\\.query', fl.recipes.override(fl.recipes.get('nvfp4'), {'fprop': 'bf16'}).replace(name='nvfp4+fprop=bf16')),
    fl.Rule('.*', 'nvfp4'),
]
