"""schooner.train.scaling: recipes, isoFLOP sweeps, fitted scaling laws and registered, scored forecasts.

- `recipe(budget)` / `ScalingRecipe`: a compute budget to a run (shape, batch, steps, optimizer), each rule
  swappable (`_rules`); `recipe(budget, rule="horizon")` / `HorizonRecipe`: Delphi's token-horizon recipe
  (AdamH), its reference constants from `reference_search` and `pick_learning_rate`.
- `isoflop_sweep(...)`: `train_lm` (+ optional evaluation) steps per (budget, size) and a results step;
  `isoflop_runs(...)` then `sweep_results(name, runs)` for the same steps when the runs are needed too.
- `fit_scaling_law(...)`: Chinchilla approach 2 (`fit_approach2`), approach 3 (`fit_approach3`: Huber,
  L-BFGS from a grid) and variable projection (`fit_varpro`: grid + NNLS), bootstrap intervals, plots.
- `fit_delphi(...)`: Marin's Delphi fit (parabolas in log tokens, E + A C^-alpha through the optima, bootstrap
  over budgets, the over-training penalty `overtraining_penalty`); also the "delphi" method of the fit and
  forecast steps.
- `soft_metrics`, `fit_soft_to_hard`: downstream forecasts (a task's soft metrics fitted like the loss,
  accuracy through a sigmoid from soft to hard).
- `forecast(...)` / `score_forecast(...)`: a prediction written before its run exists, scored after.

See docs/scaling.md.
"""

from ._approach2 import Approach2Fit as Approach2Fit
from ._approach2 import Parabola as Parabola
from ._approach2 import PowerLaw as PowerLaw
from ._approach2 import fit_approach2 as fit_approach2
from ._approach2 import fit_power_law as fit_power_law
from ._approach3 import Approach3Config as Approach3Config
from ._approach3 import ParametricFit as ParametricFit
from ._approach3 import fit_approach3 as fit_approach3
from ._approach3 import huber as huber
from ._bootstrap import Interval as Interval
from ._bootstrap import bootstrap as bootstrap
from ._bootstrap import percentile_interval as percentile_interval
from ._bootstrap import resample_runs as resample_runs
from ._delphi import AsymptoticLaw as AsymptoticLaw
from ._delphi import BudgetOptimum as BudgetOptimum
from ._delphi import DelphiFit as DelphiFit
from ._delphi import OvertrainingPenalty as OvertrainingPenalty
from ._delphi import budget_optima as budget_optima
from ._delphi import fit_asymptotic_law as fit_asymptotic_law
from ._delphi import fit_delphi as fit_delphi
from ._delphi import fit_parabola as fit_parabola
from ._delphi import optima_noise as optima_noise
from ._delphi import overtraining_penalty as overtraining_penalty
from ._delphi import parabola_lack_of_fit as parabola_lack_of_fit
from ._delphi import plot_delphi as plot_delphi
from ._delphi import vertex_loss_se as vertex_loss_se
from ._downstream import SoftToHard as SoftToHard
from ._downstream import fit_soft_to_hard as fit_soft_to_hard
from ._downstream import soft_metrics as soft_metrics
from ._fit import FitConfig as FitConfig
from ._fit import backtest as backtest
from ._fit import delphi_from_dict as delphi_from_dict
from ._fit import fit_runs as fit_runs
from ._fit import fit_scaling_law as fit_scaling_law
from ._fit import read_fit as read_fit
from ._forecast import ForecastConfig as ForecastConfig
from ._forecast import ScoreConfig as ScoreConfig
from ._forecast import forecast as forecast
from ._forecast import predict as predict
from ._forecast import run_started as run_started
from ._forecast import score as score
from ._forecast import score_forecast as score_forecast
from ._forecast import target_run as target_run
from ._horizon import HorizonFamily as HorizonFamily
from ._horizon import HorizonRecipe as HorizonRecipe
from ._horizon import HorizonRule as HorizonRule
from ._horizon import LearningRateChoice as LearningRateChoice
from ._horizon import pick_learning_rate as pick_learning_rate
from ._horizon import read_reference as read_reference
from ._horizon import reference_search as reference_search
from ._law import CHINCHILLA as CHINCHILLA
from ._law import ScalingLaw as ScalingLaw
from ._law import ScalingRun as ScalingRun
from ._law import synthetic_runs as synthetic_runs
from ._recipe import Recipe as Recipe
from ._recipe import ScalingRecipe as ScalingRecipe
from ._rules import AdamRule as AdamRule
from ._rules import BatchRule as BatchRule
from ._rules import LearningRateRule as LearningRateRule
from ._rules import ModelFamily as ModelFamily
from ._rules import ScheduleRule as ScheduleRule
from ._select import recipe as recipe
from ._sweep import SweepRun as SweepRun
from ._sweep import isoflop_runs as isoflop_runs
from ._sweep import isoflop_sweep as isoflop_sweep
from ._sweep import read_runs as read_runs
from ._sweep import run_loss as run_loss
from ._sweep import sweep_results as sweep_results
from ._varpro import VarProConfig as VarProConfig
from ._varpro import fit_varpro as fit_varpro
