"""Workers: the threaded and the asyncio worker, the loop they share, batch handlers, their
exchanges with the server, liveness."""
