"""EchoMQ: durable fan-out / fan-in for data pipelines on Redis-protocol servers."""

from .async_worker import AsyncWorker as AsyncWorker
from .client import AsyncEchoMQ as AsyncEchoMQ
from .client import EchoMQ as EchoMQ
from .errors import (
    ConfigurationError as ConfigurationError,
)
from .errors import (
    ConnectionLost as ConnectionLost,
)
from .errors import (
    EchoMQError as EchoMQError,
)
from .errors import (
    FlowCancelled as FlowCancelled,
)
from .errors import (
    FlowConflict as FlowConflict,
)
from .errors import (
    FlowTimeout as FlowTimeout,
)
from .errors import (
    InvalidArgument as InvalidArgument,
)
from .errors import (
    InvalidFlow as InvalidFlow,
)
from .errors import (
    InvalidInput as InvalidInput,
)
from .errors import (
    InvalidJobId as InvalidJobId,
)
from .errors import (
    InvalidPayload as InvalidPayload,
)
from .errors import (
    InvalidQueueName as InvalidQueueName,
)
from .errors import (
    JobNotFound as JobNotFound,
)
from .errors import (
    LeaseLost as LeaseLost,
)
from .errors import (
    ParentFailed as ParentFailed,
)
from .errors import (
    ServerError as ServerError,
)
from .errors import (
    Unrecoverable as Unrecoverable,
)
from .models import Backoff as Backoff
from .models import Child as Child
from .models import ChildFailure as ChildFailure
from .models import FlowRef as FlowRef
from .models import FlowSnapshot as FlowSnapshot
from .models import FlowSummary as FlowSummary
from .models import Job as Job
from .models import JobInfo as JobInfo
from .models import JsonSerializer as JsonSerializer
from .pump import Pump as Pump
from .queue import JobSpec as JobSpec
from .queue import Queue as Queue
from .worker import Worker as Worker

__version__ = "0.1.0"
