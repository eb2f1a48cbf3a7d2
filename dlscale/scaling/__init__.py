"""How many nodes to ask for: an α–β model of the collectives, projections to a site, and cost to solution (lesson 11).

- :mod:`~dlscale.scaling.collectives`: the α–β cost of ring and tree all-reduce, reduce-scatter and
  all-gather, one level or two (inside a node, between nodes);
- :mod:`~dlscale.scaling.nccl`: NCCL's own choice of all-reduce algorithm and protocol, by its tuning model
  (NCCL 2.30.7's constants), the price of ``auto`` on a site that runs NCCL;
- :mod:`~dlscale.scaling.fit`: α and β fitted from ``dlscale bench allreduce``'s rows, and how well
  the fit predicts sizes and rank counts it did not see;
- :mod:`~dlscale.scaling.sites`: Perlmutter's and Frontier's published link figures, with their sources;
- :mod:`~dlscale.scaling.ddp_cost`: DDP's own cost per step, a price per bucket and per byte (PyTorch's DDP
  benchmark on a V100, or ``dlscale bench ddp-cost`` here);
- :mod:`~dlscale.scaling.slowdown`: what the communication hidden behind the backward pass costs it (Lee et al.
  2025's 18.9%, or ``dlscale bench overlap`` here);
- :mod:`~dlscale.scaling.projection`: a model's step time and efficiency from 1 to 1,024 nodes;
- :mod:`~dlscale.scaling.model_size`, :mod:`~dlscale.scaling.pipeline_cost`, :mod:`~dlscale.scaling.layouts`: a
  model that may not fit one GPU (its weights, operations and activations), a pipeline's step (the schedule's bubble,
  the activations sent between stages), and ``dlscale project --layouts``: DP, FSDP, TP×DP and PP×TP×DP priced, the
  cheapest that fits chosen; :mod:`~dlscale.scaling.published_pipeline` checks it against Megatron-LM's runs;
- :mod:`~dlscale.scaling.plan`: ``dlscale plan``: a sweep's time and node-hours to a target, the
  fastest against the cheapest, a recommendation, and the next size up predicted.
"""
