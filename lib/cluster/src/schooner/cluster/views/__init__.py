"""schooner.cluster.views: the read side of the step runner's records, apart from the command line.

What `schooner status`, `explain`, `report` and `compare` show, computed from the records of a prefix
(`schooner.cluster.records`) and the experiment's steps: status rows, the static HTML report, the
explanation of why a step reruns, versions of a step side by side. Nothing here writes a record.
"""

from ._compare import compare as compare
from ._explain import Explanation as Explanation
from ._explain import explain_records as explain_records
from ._explain import explain_step as explain_step
from ._explain_named import explain_planned as explain_planned
from ._explain_named import explain_recorded as explain_recorded
from ._report import write_report as write_report
from ._scan import FoundStep as FoundStep
from ._scan import scan_prefix as scan_prefix
from ._status import print_status as print_status
from ._status import status_rows as status_rows
