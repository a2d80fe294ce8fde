"""Every tuning knob of the planner, grouped by the stage that reads it, each with what it trades.

Read as `knobs.NAME` at run time, so a test sets one here (`monkeypatch.setattr`) and every stage
sees it; docs/tuning-log.md holds the runs that chose each value, with their commands.
"""

from __future__ import annotations

# -- dividing the time limit among the stages (`dcp.planner.timebudget`) ---------------------
PHASE_SHARE = 0.1
"""Limit kept back for the phase search when some sample needs a large group: more finds splits, less leaves the single layout more."""
REACHING_SHARE = 0.5
"""Kept back instead when a split's bound meets the batch's: those batches are where phases win, so they get half."""
MIN_SEARCH_S = 0.2
"""No time is kept back for the search below this: a shorter search plans splits badly and only cuts the single layout."""
REPORT_MARGIN_PRICINGS = 3
"""Final pricings (`budget.final_pricing_s`) kept back after a phase search, for chaining a split's phases and reporting."""
REPORT_S = 0.02
"""Kept back at most for the report when no split is searched: more is safer against overrun, less is program time."""
NESTED_COLUMNS_SHARE = 0.7
"""Share of the limit the nested column plans may take after the single layout: theirs against the single layout's time."""
NESTED_COLUMNS_MIN_S = 0.7
"""Nested column plans run only when their share is at least this long: shorter finds no level in time."""

# -- the clock: the final assembly's reserve and the machine's speed (`ilp.budget`) --------------
FINAL_PRICING_S = 0.005
"""Fixed part of the final assembly's reserve: more is safer against overrun, less is search time."""
PER_SAMPLE_S = 1.5e-6
"""Reserve per sample for assembling and validating the plan (CPU seconds on the reference machine)."""
PER_MICROBATCH_S = 2.5e-6
"""Reserve per micro-batch, as `PER_SAMPLE_S`."""
PER_GROUP_S = 5e-5
"""Reserve per group, as `PER_SAMPLE_S`."""
PROBE_STEPS = 20_000
"""Steps of the machine-speed probe loop: longer measures steadier, costs more of every large solve."""
PROBE_S = 7.0e-4
"""The probe's time on the reference machine: the reserve scales with how much slower it runs here and now."""
PROBE_FROM = 1000
"""Batches from this many samples take the probe: below, the reserve is milliseconds anyway."""
MIN_SLOWDOWN = 1.5
"""Least slowdown the reserve assumes: guards against a probe that ran fast by luck."""
MAX_SLOWDOWN = 6.0
"""Most slowdown the reserve assumes: a higher one would leave the search no time."""
MIN_CPU_S = 0.02
"""CPU seconds before the wall/CPU ratio counts as the slowdown: earlier it is noise."""
FINISH_PRICINGS = 1.5
"""The final assembly's reserve in longest candidate pricings: more is safer, less is search time."""
PRICING_MARGIN = 1.5
"""Longest pricings a search step stops before the deadline, so pricing its result ends in time."""

# -- the warm start and the floor (`ilp.warm`) ---------------------------------------------------
ZERO3_FILL_FIRST_STAGE = 3
"""From this ZeRO stage the fill runs right after dcp-greedy, with most of the time (lockstep slots favour it)."""
ZERO3_FILL_SHARE = 0.8
"""Share of the time before the final assembly the ZeRO-3 fill may take: its plans against the program's."""
BEST_FIT_SHARE = 0.2
"""Share of the time left the best fit may take: its packings against the program's time."""
WARM_SHARE = 0.3
"""Optional warm-start work stops once this share of the budget is gone: better starts against program time."""

# -- the ILP's steps (`ilp`) ---------------------------------------------------------------------
ALIGN_SHARE = 0.5
"""ZeRO-3: share of the time left for lining up the warm start's slots before the program."""
EXACT_MAX_SAMPLES = 6
"""Batches up to this many samples get the exact program (proven optimal, exponential beyond)."""
EXACT_MAX_GPUS = 8
"""...on up to this many GPUs."""

# -- the heuristic (`ilp.heuristic`) -------------------------------------------------------------
HEURISTIC_TARGETS = (1.0, 1.04, 1.1, 1.25)
"""The heuristic's targets (multiples of the proven bound): more targets, more candidates, more time."""

# -- few large micro-batches (`ilp.fill`) --------------------------------------------------------
FILL_EXTRA_MICROBATCHES = 1
"""Micro-batches per group beyond the fewest that hold the batch: room to balance against fixed costs."""
FILL_WORTH_IT = 0.1
"""Fill at a size only where a micro-batch's fixed cost is at least this share of full checkpointing's cost."""
FILL_HEAVY = 1.0
"""From this ratio of fixed cost the fill runs at any batch size, below it only up to `FILL_MAX_SAMPLES`."""
FILL_MAX_SAMPLES = 4096
"""Batches the fill places below `FILL_HEAVY`: past them its placement costs tenths of a second."""
FILL_CHECK_EVERY = 16
"""Placement steps between two looks at the clock: fewer looks are faster, more stop nearer the deadline."""
FILL_ONE_BY_ONE = 1024
"""The longest samples placed one at a time (exact), the rest in rounds (fast)."""
FILL_ROUNDS = 64
"""Rounds for the rest: more places them more evenly, at more passes."""

# -- best fit by SP size (`ilp.bestfit`) ---------------------------------------------------------
BEST_FIT_LEVEL_STEPS = 8
"""Bisection steps on the best fit's level: a lower level against more packings."""
BEST_FIT_LEVEL_RTOL = 2e-3
"""Bisection stops once the bracketing levels are this close (relative)."""
BEST_FIT_RING_RUNS = 4
"""Fill rounds per group at sizes that run rings (each prices a run of candidates at once)."""

# -- dcp-greedy (`greedy`) -----------------------------------------------------------------------
GREEDY_MAX_PROMOTIONS = 16
"""Target steps tried and straggler promotions at most: a faster plan against more re-balancing."""
GREEDY_PROMOTE_UP_TO = 4000
"""Straggler promotions only up to this many micro-batches (each re-schedules them all)."""

# -- local search and list scheduling (`ilp.pack`) -----------------------------------------------
IMPROVE_STEPS = 300
"""Local-search steps after each warm start and program solve: a better plan against time."""
SWAP_TOP = 24
"""Swaps try this many of the slowest group's largest samples..."""
SWAP_GROUPS = 8
"""...against every sample of this many least-loaded groups..."""
SWAP_PER_SIZE = 2
"""...and of this many least-loaded groups of each SP size..."""
SWAP_OTHERS = 2048
"""...over at most this many of their samples: wider swaps against milliseconds a step."""
MULTIFIT_ITEMS = 8
"""MULTIFIT spreads classes of at most this many samples per group, LPT the larger (faster, looser)."""
MULTIFIT_MAX = 600
"""...and at most this many samples in all (each bisection step is a pass per sample)."""
EJECT_TOP = 4
"""`_grow` tries this many of the slowest group's costliest samples."""
REBALANCE_SMALL_SHARE = 1 / 4
"""`rebalance` re-spreads the samples below this share of the mean load..."""
REBALANCE_MAX = 6000
"""...the largest this many of them (each a heap step in Python)."""
LPT_HEAD = 4
"""`lpt.lpt` runs LPT proper on the longest n_groups * this jobs, the rest vectorized (exact against fast)..."""
LPT_SHARE = 1 / 64
"""...and on every job above this share of the mean load per group (the backfill's rounds too)."""

# -- neighbourhood search (`ilp.lns`) ------------------------------------------------------------
LNS_NEIGHBOURS = 6
"""Groups per neighbourhood: larger finds more, each solve is slower."""
LNS_MAX_ITEMS = 160
"""Samples per neighbourhood at most."""
LNS_NODES = 10
"""Node limit per neighbourhood solve (deterministic)."""
LNS_SOLUTIONS = 3
"""A neighbourhood solve stops at this improving solution: many quick rounds against a few long ones."""
LNS_GAP = 0.002
"""Relative gap at which a neighbourhood solve stops."""
LNS_MIN_S = 0.015
"""A neighbourhood solve starts only with this long left (its model is built before the solver's limit)."""

# -- the programs (`ilp.search`) -----------------------------------------------------------------
ROUNDS_PER_S = 1.0
"""Class-program solves per second of limit: later rounds start from tighter cuts."""
LNS_ROUNDS = 6
"""Neighbourhood re-solves after each program solve."""
PATTERN_ROUNDS = 2
"""Configuration-program rounds after the class program's, while each improves."""
PATTERN_STEP = 0.25
"""The configuration program's level, this share of the way from the bound to the incumbent."""
PATTERN_SOLVE_SHARE = 0.2
"""A configuration-program solve stops after this share of the limit (its root can be slow)."""
PATTERN_TRIES = 3
"""Levels tried per round while the configuration program proves them infeasible."""
PROGRAM_MIN_S = 0.03
"""A program round starts only with this long left before the search deadline."""
CLASS_SHARE = 0.5
"""Share of the search time left a class-program solve may take: the rest goes to what follows."""
COLUMN_SHARE = 0.8
"""Share of the search time left the column program (few shapes) may take..."""
COLUMN_BOUND_SHARE = 0.3
"""...of which its bound's bisection may take this share, so that its plan keeps time."""
COLUMN_LEVELS = (1.015, 1.03, 1.06)
"""Levels (multiples of its proven bound) the column program seeks a plan at, the first that gives one."""
COLUMN_SPLITS = 3
"""Bisection steps between the levels with and without a plan, while time lasts."""
COLUMN_SPLIT_RTOL = 2e-3
"""...until the two are this close (relative)."""

# -- length classes of the class program (`ilp.classes`) -----------------------------------------
CLASS_FLUID_SHARE = 0.03
"""Samples below this share of U are fluid (bucketed), above exact: a tighter program against more rows."""
CHEAPEST_LARGE = 0.25
"""Without large samples, those over this share of U at their cheapest size count as large."""
CLASS_RATIO_TOL = 0.005
"""Fluid buckets group samples whose cost ratios differ by at most this (relative)."""
CLASS_MAX_EXACT = 48
"""Exact types (length bands) at most: the program's integer columns."""
CLASS_BAND_TOL = 0.01
"""Exact types group lengths within this (relative)."""
CLASS_MAX_BUCKETS = 96
"""Fluid buckets at most: past it the ratio tolerance doubles."""

# -- the class program's cuts (`ilp.cuts`) -------------------------------------------------------
CUT_LEVELS = 4
"""Busy-time levels at which bin-packing cuts apply: tighter bounds against a larger program."""
COUNT_MAX_K = 64
"""Counting cuts for items down to theta / (this + 1)."""

# -- the configuration program (`ilp.patterns`) --------------------------------------------------
PATTERN_PARTS = 8
"""A sample is large at a size when its load there exceeds theta / this."""
MAX_PATTERNS = 1500
"""Patterns per program at most; past it fewer samples count as large."""
ROOT_S_PER_COLUMN = 2.5e-4
"""Seconds per pattern its root node may take: the program gets only as many patterns as fit the time."""
PATTERN_NODES = 50
"""Branch-and-bound nodes per solve (deterministic)."""

# -- column generation (`colgen`): the single layout's program (`ilp.columns`) and the nested one -------
COLUMN_MAX_SHAPES = 64
"""Distinct (tokens, pairs) shapes at most for the column program to be posed."""
COLUMN_UNITS = 1000
"""Knapsack weights in steps of theta / this: finer prices better, each knapsack is slower."""
COLUMN_MAX_ROUNDS = 60
"""Single layout: column-generation rounds per level at most (a tighter program against time)."""
COLUMN_IP_NODES = 200
"""Branch-and-bound nodes for the integer program over the columns (both programs)..."""
COLUMN_IP_SHARE = 0.25
"""...and the share of the time left it may take (the rounded fractional optimum is the fallback)."""
NESTED_MAX_ROUNDS = 40
"""Nested program: column-generation rounds per level at most (a tighter program against time for more levels)..."""
NESTED_TAIL_ROUNDS = 6
"""...ending where the last this many rounds..."""
NESTED_TAIL = 0.0002
"""...lowered the program by less than this share of the GPUs: rounds that barely help against time."""
NESTED_IP_SHARE = 0.8
"""Share of the time left its integer program may take (it covers only what whole copies leave)."""
NESTED_UNITS = 500
"""Its knapsack weights in steps of theta / this (coarser than `COLUMN_UNITS`: three times the knapsacks)."""

# -- the exact program (`ilp.exact`) -------------------------------------------------------------
EXACT_MAX_NODES = 200_000
"""Node limit of the exact program: it is tiny, let it prove optimality (its time limit still applies)."""

# -- the solver back end (`ilp.solvers`) ---------------------------------------------------------
SOLVER_MAX_NODES = 1000
"""Branch-and-bound node limit of a program solve: a deterministic stop, the time limit the safety net."""

# -- the cost table (`ilp.costs`) ----------------------------------------------------------------
FIRST_FIT_PARTS = 8
"""`pack_tokens` places samples above capacity / this one by one (first fit); smaller ones fill."""

# -- the phase search (`phases`) -----------------------------------------------------------------
MIN_NEED_SHARE = 1 / 2
"""Splits are tried for samples that need at least this share of the GPUs."""
MAX_SPLITS = 3
"""Splits planned for real at most, the most promising first."""
SPLIT_MIN_S = 0.02
"""A split is planned only with at least this long left for it."""
FIRST_SPLIT_SHARE = 0.85
"""Share of the search's time for the first split when there are others."""
HEAD_SHARE = 0.2
"""Share of a split's time for its first phase (few samples: quick to plan)."""
MIN_BESIDE_S = 0.15
"""A split beside the k runs only with this long for it (three parts, each with its warm start)."""
BESIDE_SHARE = 0.85
"""Share of a split's time for the split beside the k samples; the sequential split gets the rest."""
NESTED_COLUMNS_PER_GPU = 4
"""Nested column plans are sought below this many samples per GPU (above, single layouts suffice)."""

# -- backfill plans (`backfill`) -----------------------------------------------------------------
BACKFILL_LEVELS = (1.0, 1.02)
"""The first two targets for the core groups (multiples of the busy bound), in the order tried."""
BACKFILL_ONWARD = ((1.0075, 1.01, 1.015, 1.0225, 1.025, 1.03), (1.0225, 1.015, 1.025, 1.01, 1.03, 1.0075))
"""The targets after them, on the side of the faster of the first two."""
BACKFILL_LEVELS_SHARE = 0.3
"""No target after the second starts past this share of the limit: more targets against ILP time."""
BACKFILL_FIRST_END_SHARE = 0.5
"""Nor any after the first that would end past this share, its assembly included."""
BACKFILL_BOTH_UP_TO = 16384
"""Batches up to this many samples try both placements of a core's short room (better, slower)."""
BACKFILL_REBALANCE_MOVES = 4
"""`_rebalance` moves at most this many fillers per slot."""
BACKFILL_CLOSE_ENOUGH = 0.005
"""No further target once a plan's busy time is within this of the bound."""
BACKFILL_PASSES = 3
"""Passes filling a core group's short room."""
BACKFILL_FEW_PER_GPU = 4
"""Batches below this many samples per GPU try only the first two targets."""
BACKFILL_FEW_COST_SHARE = 0.25
"""...and none when assembling a plan would take over this share of the limit."""
BACKFILL_MIN_PER_GPU = 2
"""Backfill plans are built from this many samples per GPU (the nested plan below)."""
BACKFILL_WATER_FROM = 256
"""`_lpt` water fills the fillers below `LPT_SHARE` of the mean load only past this many per slot (fast, looser)."""

# -- nested plans (`nested`) ---------------------------------------------------------------------
NESTED_LEVELS = (1.0, 1.005, 1.01)
"""Targets (multiples of the busy bound), in the order tried."""
NESTED_LEVELS_SHARE = 0.3
"""No target after the first starts past this share of the limit: more targets against ILP time."""

# -- nested column plans (`nested_columns`) ------------------------------------------------------
NESTED_FIRST_LEVEL = 1.0225
"""The first level tried (multiple of the busy bound)..."""
NESTED_UP_LEVELS = (1.0275, 1.035, 1.045, 1.07)
"""...then these upward until one gives a plan..."""
NESTED_GUESS_LEVEL = 1.0175
"""...then this one when it lies in the bracket..."""
NESTED_FINEST = 0.001
"""...then bisection down to this width: a finer level against more programs."""
NESTED_TOP_UP_ROUNDS = 3
"""Rounds of topping up the fractional optimum's columns."""
NESTED_ATTEMPTS = 3
"""Fractional optima the integer program starts from..."""
NESTED_PERTURB = 0.02
"""...the second on with each column's GPUs scaled by up to this share more."""
NESTED_TRIES = 3
"""Shapes `_top_up` tries for each sample it adds."""

# -- ZeRO-3's lined-up slots (`slots`) -----------------------------------------------------------
SLOT_RESHAPES = 2
"""Passes refilling micro-batches against the slots' lengths, while each gains 0.1%."""
SLOT_RESHAPE_WITHIN = 0.25
"""...for slot counts whose first pass estimates within this share of the best."""
SLOT_ONE_BY_ONE = 2
"""Samples per group placed one at a time at least."""
SLOT_BIG = 0.1
"""...and while some group's next sample takes this share of an even micro-batch."""
SLOT_ROUNDS = 16
"""Rounds of the even dealing at most."""
SLOT_GROWTH = 1.5
"""Slot counts tried this factor apart: finer against more counts priced."""
SLOT_SPAN = 32.0
"""Slot counts tried up to this factor above the fewest."""
SLOT_WORSE = 2
"""Counts stop after this many in a row are no more than `SLOT_GAIN` faster."""
SLOT_GAIN = 0.005
"""See `SLOT_WORSE`."""

# -- lower bounds (`bounds`) ---------------------------------------------------------------------
BOUND_MAX_STEPS = 40
"""Root-finding steps at most on work(M) = N * M."""
BOUND_MAX_CELLS = 1_000_000
"""Levels x samples the makespan bound evaluates at once; past it, length classes (looser, faster)."""
BOUND_MEMO_SIZE = 16
"""Batches whose bounds are memoized."""
BOUND_COARSE = 2048
"""Classes of samples at most for bounds priced at many busy times..."""
BOUND_COARSE_EXACT = 16
"""...of which the longest samples keep their own."""
BOUND_RELEASE_SAMPLES = 4
"""How many of the longest samples the release bound prices."""
BOUND_SPREAD_LAYERS = 6
"""How many checkpoint levels the spread bound prices."""
BOUND_GRID = 8
"""Intervals above the bound the least-step bound splits busy times into..."""
BOUND_GRID_STEP = 0.02
"""...each this share of the bound wide."""
BOUND_EXPOSURE_CLASSES = 256
"""Classes of samples the exposure bound prices at most (rounded down)."""
BOUND_CAPPED_CHAIN_SHARE = 0.5
"""The exposure bound caps a charge only where the chain is over this share of the step bound."""
BOUND_WEIGH_PASSES = 3
"""Passes weighing the sizes: tighter bounds against time (three match eight on the grid)."""

# -- the longest sample's group bound (`bounds.group`) --------------------------------------------
GROUP_BOUND_STEPS = 24
"""Bisection steps at most."""

# -- list scheduling (`lpt`) ---------------------------------------------------------------------
LPT_SHORT_ROUND = 16
"""Rounds of fewer jobs, or fewer groups than this, go by heap steps (exact) rather than vectorized."""
