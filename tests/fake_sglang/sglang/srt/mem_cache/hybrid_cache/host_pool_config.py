"""Fake: the packed draft layers' transfer ids after the target's."""


def with_packed_draft_layer_mapping(layer_mapping: dict[int, int], *, transfer_layer_start: int,
                                    target_device_layer_num: int, draft_layer_num: int) -> dict[int, int]:
    return layer_mapping | {transfer_layer_start + d: target_device_layer_num + d for d in range(draft_layer_num)}
