

def test_device_names_as_cuda_reports_them():
    """discover(gpu=torch.cuda.get_device_name()) on an H200 raised KeyError('nvidia h200')."""
    from fact_db.core.device import device
    assert device("NVIDIA H200").name == "H200"
    assert device("NVIDIA H100 80GB HBM3").name == "H100"
    assert device("h200").name == "H200" and device("A100-SXM4-80GB").name == "A100"
    assert device(None, "sm80").name == "A100" and device("RTX 4090").name == "H100"
