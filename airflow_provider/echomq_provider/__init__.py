"""The EchoMQ provider for Apache Airflow 3.1 to 3.3 (Task SDK).

Installed with ``pip install airflow-provider-echomq``; Airflow finds it through the
``apache_airflow_provider`` entry point (:mod:`echomq_provider.get_provider_info`).

==========================================  ==================================================
module                                      holds
==========================================  ==================================================
``hooks.echomq``                            :class:`EchoMQHook`: the ``echomq`` connection type,
                                            a sync client for tasks, an async one for triggers
``hooks.settings``                          :class:`EchoMQConnectionSettings`: an Airflow
                                            connection read into client arguments
``operators.echo_flow``                     :class:`EchoFlowOperator`: adds a flow
``sensors.echo_flow``                       :class:`EchoFlowSensor`: waits for it (poke,
                                            reschedule, deferrable); results go to XCom
``triggers.echo_flow``                      :class:`EchoFlowTrigger`: the deferrable wait
``flow_specs``                              DAG values -> flow arguments: child specs, the
                                            parent id derived from the task instance, refs
==========================================  ==================================================

Nothing here is imported by this ``__init__``: Airflow imports each module by name, and
``get_provider_info`` must stay cheap (every ``airflow`` command calls it at start).
"""
