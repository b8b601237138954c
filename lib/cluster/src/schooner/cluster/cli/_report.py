"""The report's old private home: `write_report` is `schooner.cluster.write_report` (it lives in
`schooner.cluster.views`). Kept for one release for code that imported it from here."""

from schooner.cluster.views._report import write_report as write_report
