"""Where Airflow looks for this provider's example DAGs; import :mod:`echomq_provider` instead.

Airflow 3.3 finds the example DAGs of a provider outside ``airflow.providers`` by importing its
distribution name with dashes turned to underscores (``airflow-provider-echomq`` ->
``airflow_provider_echomq``) and reading ``example_dags/`` beside that module; a provider
without such a module logs an exception on every DAG parse while ``load_examples`` is on (the
default). This module answers that lookup: its search path is the provider package's, so the
example DAGs Airflow loads are :mod:`echomq_provider.example_dags`. Nothing else imports it.
"""

import echomq_provider

__path__ = list(echomq_provider.__path__)
