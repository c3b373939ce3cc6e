"""flexinfer.proxy"""
