"""The CUDA API calls whose CUPTI records gputrace asks for (launches, copies, sets, graph launches,
the sync canary's synchronize calls): CUPTI 13.4's ``cupti_driver_cbid.h`` / ``cupti_runtime_cbid.h``
ids (only ever appended) whose names match ``cupti_lib.KEEP_CALLS``; newer ids are matched at start.
Names come from libcupti (``cuptiGetCallbackName``, once per id, ``_vN`` dropped as PyTorch and HTA do).
"""

DRIVER_SIZE = 868  # CUPTI_DRIVER_TRACE_CBID_SIZE in 13.4
RUNTIME_SIZE = 566  # CUPTI_RUNTIME_TRACE_CBID_SIZE in 13.4

# fmt: off
# driver API (cuLaunchKernel, cuMemcpy*, cuMemset*, cuGraphLaunch, *Synchronize, ...)
DRIVER = (
    17, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66,
    67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 115, 116, 117, 121, 126, 216, 217,
    218, 219, 220, 221, 222, 223, 224, 225, 226, 227, 232, 233, 234, 248, 249, 250, 251, 252, 253, 254,
    276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287, 288, 289, 290, 291, 292, 293, 305, 306,
    307, 318, 319, 320, 321, 397, 398, 399, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411,
    412, 413, 414, 415, 416, 418, 419, 420, 421, 422, 423, 424, 425, 426, 427, 428, 429, 430, 431, 432,
    433, 440, 442, 477, 478, 480, 504, 505, 506, 507, 508, 514, 515, 520, 527, 528, 562, 563, 652, 653,
    776, 777, 778, 779, 796, 797, 798, 799, 800, 831, 832, 837, 838, 839, 840
)
# runtime API (cudaLaunchKernel, cudaMemcpy*, cudaMemset*, cudaGraphLaunch, *Synchronize, ...)
RUNTIME = (
    13, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 126,
    131, 137, 142, 143, 144, 145, 160, 161, 162, 163, 165, 211, 213, 214, 215, 216, 217, 218, 219, 220,
    221, 222, 223, 224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 239, 243, 244, 245,
    246, 249, 250, 269, 270, 272, 284, 285, 290, 291, 292, 293, 294, 295, 311, 312, 332, 333, 350, 351,
    352, 353, 354, 355, 356, 357, 358, 430, 431, 482, 483, 484, 485, 505, 506, 509, 510, 511, 512, 534,
    550, 551, 554, 555, 556, 557
)
# fmt: on
