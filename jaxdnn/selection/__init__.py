"""Algorithm selection, shared by every op family.

- ``core``: what every family shares: the registry's answers (``AlgoInfo``), the choice and
  why (``Choice``, ``select_algorithm``: forced, heuristic or benchmark under the
  jaxdnn.config policy), find's timer and its check-and-time loop (``find_checked``), and the
  registry of families (``Family``, ``register_family``) that lowering rules and ``explain``
  look up by primitive.
- ``cache``: benchmark mode's on-disk tuning cache, one file per family and device.
- ``explain``: the walk through a traced function's jaxpr and ``jaxdnn.explain``.
- ``conv``, ``softmax``, ``norm``, ``pool``: each family's problem descriptor, registry query,
  find and registration. ``jaxdnn/__init__.py`` imports them, which registers them.

The op modules (``jaxdnn/ops``) keep the public functions, primitives and their rules; their
lowering rules ask ``core.choose_for_call`` for the algorithm.
"""
