"""What the pool's routers should know, pure: which engines they route to, which circuit breakers to reset, and
the router's control-plane key."""
