"""flexinfer.http"""
