

def test_device_names_as_cuda_reports_them():
    """discover(gpu=torch.cuda.get_device_name()) on an H200 raised KeyError('nvidia h200')."""
    from fact_db.discovery import roofline
    assert roofline.device("NVIDIA H200").name == "H200"
    assert roofline.device("NVIDIA H100 80GB HBM3").name == "H100"
    assert roofline.device("h200").name == "H200" and roofline.device("A100-SXM4-80GB").name == "A100"
    assert roofline.device(None, "sm80").name == "A100" and roofline.device("RTX 4090").name == "H100"
