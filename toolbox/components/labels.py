"""Labels at the very end: OCI, toolbx, the stack and its digest, one per pin."""

from pydantic import Field

from toolbox.components import Component, Model

LABEL_PREFIX = "io.github.toolbox."  # the image labels of the stack and of each pin


def labels(stack, pin_set) -> dict[str, str]:
    img = stack.model.image
    out = {
        "com.github.containers.toolbox": "true",
        "org.opencontainers.image.description": img.description or stack.model.description,
        "org.opencontainers.image.licenses": img.licenses,
        "org.opencontainers.image.source": img.source,
        "org.opencontainers.image.title": f"{img.title}-{stack.model.name}",
        "org.opencontainers.image.vendor": img.vendor,
        "org.opencontainers.image.version": pin_set.digest,
        LABEL_PREFIX + "stack": stack.model.name,
        LABEL_PREFIX + "lock-digest": pin_set.digest,
        LABEL_PREFIX + "platform": stack.model.platform,
    }
    if stack.model.base.digest:
        out["org.opencontainers.image.base.digest"] = stack.model.base.digest
    out["org.opencontainers.image.base.name"] = stack.model.base.image
    for pin, value in pin_set.pins.items():
        out[LABEL_PREFIX + pin] = value
    return dict(sorted(out.items()))


class Image(Model):
    title: str = Field("toolbox", description='image title; the label gets -<stack name> appended')
    description: str = Field("", description="OCI description label (default: the stack's description)")
    source: str = Field("https://github.com/toolbox/toolbox", description='OCI source label')
    licenses: str = Field("Apache-2.0", description='OCI licenses label')
    vendor: str = Field("toolbox", description='OCI vendor label')


COMPONENT = Component("labels", place=110,
                      block=Image, field=Field(default_factory=Image, description='OCI labels'), key="image",
                      applies=lambda s: True, pins=lambda s: {"platform": s.model.platform},
                      runtime="runtime/labels.j2", variables=lambda s, pin_set: {"labels": labels(s, pin_set)})
