"""schooner.data: records, readers and writers, the lazy sharded Dataset pipeline and the embedded corpus."""

from ._dataset import Dataset as Dataset
from ._errors import DataError as DataError
from ._errors import SkipLog as SkipLog
from ._execute import Execution as Execution
from ._folders import list_shards as list_shards
from ._readers import detect_format as detect_format
from ._readers import read_records as read_records
from ._readers import read_shards as read_shards
from ._records import RECORD_FIELDS as RECORD_FIELDS
from ._records import content_id as content_id
from ._records import make_record as make_record
from ._records import normalize as normalize
from ._writer import WRITE_FORMATS as WRITE_FORMATS
from ._writer import ShardWriter as ShardWriter
from ._writer import read_manifest as read_manifest
from ._writer import shard_name as shard_name
from ._writer import write_records as write_records
