"""EchoMQ for Dagster: a resource that runs the Pump, flow results as asset inputs, a sensor.

Install with ``pip install dagster-echomq``. See ``examples/dagster/`` for Definitions that
fan out across two queues and summarise the children's results downstream.
"""

from .io_manager import FLOW_PARENT_ID as FLOW_PARENT_ID
from .io_manager import FLOW_QUEUE as FLOW_QUEUE
from .io_manager import EchoMQIOManager as EchoMQIOManager
from .io_manager import FlowFailedError as FlowFailedError
from .io_manager import flow_metadata as flow_metadata
from .resource import EchoMQResource as EchoMQResource
from .sensor import echomq_flow_sensor as echomq_flow_sensor
from .sensor import flow_from_tags as flow_from_tags
