"""EchoMQ for Dagster: a resource, flow results as asset inputs, a sensor that launches runs
for released flows.

Install with ``pip install dagster-echomq``. See ``examples/dagster/`` for Definitions that
fan out across two queues (also per daily partition) and summarise the children's results
downstream, and the documentation's Dagster page (docs/dagster.md) for how to deploy it.

``__version__`` is echomq's: the two are released in step (this distribution pins ``echomq``
to its own version; see hatch_build.py). Importing the package registers it in Dagster's
library registry, as Dagster's own integrations do, so a code location reports it beside
theirs; ``is_dagster_package=False`` because its version follows echomq's, not Dagster's
(Dagster checks its own packages' versions against its own).
"""

from dagster._core.libraries import DagsterLibraryRegistry

from echomq_core import __version__ as __version__

from .automation import after_release as after_release
from .automation import echomq_release_sensor as echomq_release_sensor
from .automation import echomq_released as echomq_released
from .checks import echomq_flow_check as echomq_flow_check
from .config import EchoMQConfig as EchoMQConfig
from .failures import FlowFailedError as FlowFailedError
from .failures import NotABarrierFlow as NotABarrierFlow
from .following import FlowFollow as FlowFollow
from .handles import EmptyFlow as EmptyFlow
from .input_settings import echomq_input as echomq_input
from .io_manager import EchoMQIOManager as EchoMQIOManager
from .metadata import FLOW_PARENT_ID as FLOW_PARENT_ID
from .metadata import FLOW_PARTITIONS as FLOW_PARTITIONS
from .metadata import FLOW_QUEUE as FLOW_QUEUE
from .metadata import flow_metadata as flow_metadata
from .reading import FlowStream as FlowStream
from .resource import EchoMQResource as EchoMQResource
from .run_sensors import echomq_cancel_sensors as echomq_cancel_sensors
from .sensor import echomq_flow_sensor as echomq_flow_sensor
from .sensor import flow_from_tags as flow_from_tags

DagsterLibraryRegistry.register("dagster-echomq", __version__, is_dagster_package=False)
