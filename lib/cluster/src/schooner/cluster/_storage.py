"""The old private home of `schooner.cluster.storage`: kept so code that imported it keeps working for a
release. Import `schooner.cluster.storage` instead."""

from .storage import FsspecStorage as FsspecStorage
from .storage import LocalStorage as LocalStorage
from .storage import Storage as Storage
from .storage import atomic_open as atomic_open
from .storage import atomic_write as atomic_write
from .storage import clear_folder as clear_folder
from .storage import is_local as is_local
from .storage import is_temp_name as is_temp_name
from .storage import list_folder as list_folder
from .storage import normalize_prefix as normalize_prefix
from .storage import storage_for as storage_for
from .storage import temp_name as temp_name
from .storage import unique_tag as unique_tag
