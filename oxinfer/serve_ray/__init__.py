"""oxinfer on Ray Serve (`pip install 'oxinfer[ray]'`, `oxinfer serve --ray`): replicas that each
hold one Engine behind one OpenAI-compatible endpoint, routed by prompt prefix. See docs/ray.md.

    from oxinfer.serve_ray import RayServeConfig, build_app
    serve.run(build_app(RayServeConfig(model="m.gguf", replicas=2)), route_prefix="/")
"""

__all__ = ["RayServeConfig", "build_app", "run"]


def __getattr__(name: str):
    if name == "RayServeConfig":  # the config needs no ray, but the server's app (its body limit)
        from oxinfer.serve_ray.config import RayServeConfig

        return RayServeConfig
    if name in ("build_app", "run"):  # these need ray; the config does not
        from oxinfer.serve_ray import deploy

        return getattr(deploy, name)
    raise AttributeError(f"module 'oxinfer.serve_ray' has no attribute {name!r}")
