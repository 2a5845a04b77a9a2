"""Kernel emitters by op family; `registry.EMITTERS` maps each op to its emitter."""
