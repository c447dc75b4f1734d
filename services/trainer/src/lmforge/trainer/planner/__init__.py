"""`lmforge-train plan`: the capacity planner. For a model, a token budget and a cluster it
predicts, for every candidate parallel layout (data-parallel replicate × shard, tensor,
pipeline, context and expert parallelism), the memory each GPU needs and whether it fits, the
communication per step on each axis, the step time and MFU, and from the fastest layout that
fits the run's FLOPs, GPU-hours, days and cost; the recommendation is rendered as the chart's
training values (the `parallel:` keys of the trainer's layout config).

One job per module:

  hardware   the GPU table (datasheet figures, with sources) and the cluster
  shape      the model's parameters and FLOPs per layer, from lmforge.model.transformer's GPTConfig
  layout     a candidate layout: the trainer's own (lmforge.trainer.layout_rules.MeshLayout)
  memory     bytes per GPU by part (parameters, gradients, optimizer state, activations)
  comm       bytes and seconds per step on each axis
  timing     compute time, pipeline bubble, step time and MFU
  efficiency the kernel efficiency by matmul width, and Float8's speed-up (the fitted curve)
  calibration the measured runs (calibration.json) the efficiency is fitted to, the fit, the comparison
  costs      run totals: FLOPs, GPU-seconds, wall-clock days, cost (the seed's 70B arithmetic)
  search     the candidates (only layouts the trainer runs: lmforge.trainer.layout_rules, its own
             start check), their evaluation and the recommendation
  render     the plan as a table, as JSON, and as the chart's training values
  command    the `plan` subcommand's arguments and handler
  request    the plan's inputs (a PlanRequest) from those arguments
  schedule_plan   `plan --schedule`: the trainer's schedule resolved and placed, a search per stage
  schedule_render a schedule's plan as a table, as JSON, and as the chart's values for the whole run

docs/planning.md shows a 70B plan and where each figure comes from.
"""
